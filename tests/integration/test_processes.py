"""Real OS processes racing for the same effect keys on the shared test store."""
from __future__ import annotations

import json
import time

import pytest

from ctrlrun.models import EffectRecord, Receipt

from tests.support import LEDGER_POLICY, run_together, script_environment

RACER = """
import fcntl, json, sys, time
import ctrlrun

start_at, keys, worker = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

@ctrlrun.protect("ledger.post", effect="post:{entry_id}")
def post(entry_id: str) -> str:
    with open("executions.log", "a") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(entry_id + "\\n")
    return entry_id

counts = {"ran": 0, "duplicate": 0, "other": []}
with ctrlrun.context(agent="worker-" + worker):
    post(entry_id="warm-" + worker)
    while time.time() < start_at:
        time.sleep(0.001)
    for k in range(keys):
        try:
            post(entry_id=f"k{k}")
            counts["ran"] += 1
        except ctrlrun.DuplicateEffect:
            counts["duplicate"] += 1
        except ctrlrun.CTRLRunError as exc:
            counts["other"].append(f"{type(exc).__name__}: {exc}")
print(json.dumps(counts))
"""

DISTINCT = RACER.replace('post(entry_id=f"k{k}")', 'post(entry_id=f"w{worker}-k{k}")')


def race(tmp_path, source: str, workers: int, keys: int) -> tuple[list[dict], list[str]]:
    """Run ``source`` as ``workers`` OS processes released at the same instant, each calling ``keys``
    times; what each counted, and the lines the executions wrote to executions.log."""
    env = script_environment(tmp_path, LEDGER_POLICY)
    (tmp_path / "racer.py").write_text(source)
    start_at = time.time() + 4.0  # every worker has imported Django and warmed up by then
    outputs = run_together(tmp_path, "racer.py", [[str(start_at), str(keys), str(n)] for n in range(workers)], env)
    return [json.loads(out) for out in outputs], (tmp_path / "executions.log").read_text().split()


@pytest.mark.slow
def test_racing_processes_execute_each_key_once(transactional_db, tmp_path):
    """Four processes race for the same 25 keys: each key runs exactly once, every loser is a duplicate."""
    workers, keys = 4, 25
    counts, lines = race(tmp_path, RACER, workers, keys)
    executed = [line for line in lines if line.startswith("k")]
    assert sorted(executed) == sorted(f"k{k}" for k in range(keys))  # each exactly once
    assert sum(c["ran"] for c in counts) == keys
    assert sum(c["duplicate"] for c in counts) == keys * (workers - 1)
    assert [c["other"] for c in counts] == [[]] * workers
    assert EffectRecord.objects.filter(state="committed").count() == keys + workers
    seqs = list(Receipt.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) == keys * workers + workers


@pytest.mark.slow
def test_processes_on_distinct_keys_all_execute_once(transactional_db, tmp_path):
    """Four processes on their own keys: every call executes exactly once, and the chain stays linear."""
    from ctrlrun import store

    workers, keys = 4, 25
    counts, lines = race(tmp_path, DISTINCT, workers, keys)
    assert [c["ran"] for c in counts] == [keys] * workers
    assert [c["duplicate"] for c in counts] == [0] * workers
    executed = [line for line in lines if "-k" in line]
    assert sorted(executed) == sorted(f"w{n}-k{k}" for n in range(workers) for k in range(keys))
    report = store.verify()
    assert report.ok and report.verified == workers * keys + workers
