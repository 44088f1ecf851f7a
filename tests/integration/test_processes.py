"""Real OS processes racing for the same effect keys on the shared test store."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import pytest
from django.utils import timezone

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



FIRST_CALL = """
import sys, time
import ctrlrun
from ctrlrun.control import default_control

@ctrlrun.protect("ledger.post", effect="post:{entry_id}")
def post(entry_id: str) -> str:
    return entry_id

if sys.argv[1] == "hash":
    print(default_control().read_policy().hash)
else:
    with ctrlrun.context(agent="worker-" + sys.argv[1]):
        print(post(entry_id="first-" + sys.argv[1]))
"""


@pytest.mark.slow
def test_processes_making_their_first_call_at_once_store_the_policy_once(transactional_db, tmp_path):
    """Processes making their first call at once each find the policy not stored yet and store it: on
    PostgreSQL every insert but one meets the winner's row (a unique violation). Held up behind another
    transaction's insert of that hash, all of them reach the insert together; every call still runs, the
    losers judge the winner's row, and the text is stored once."""
    from django.db import transaction

    from ctrlrun.models import PolicyDocument

    env = script_environment(tmp_path, LEDGER_POLICY)
    (tmp_path / "first.py").write_text(FIRST_CALL)
    policy_hash = subprocess.run([sys.executable, "first.py", "hash"], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=120, check=True).stdout.strip()

    class Released(Exception):
        pass

    procs = []
    with contextlib.suppress(Released), transaction.atomic():
        # Not committed: the workers see no row, and their inserts of this hash wait for this one.
        PolicyDocument.objects.create(hash=policy_hash, schema="-", source="-", text="-", environment="-",
                                      first_seen=timezone.now())
        procs = [subprocess.Popen([sys.executable, "first.py", str(n)], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(4)]
        time.sleep(3.0)  # every worker has started and waits on the insert (or, on SQLite, the write lock)
        raise Released  # rolled back: the workers' inserts go on
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [(proc.returncode, err) for proc, (_, err) in zip(procs, outputs)] == [(0, "")] * 4
    assert sorted(out.strip() for out, _ in outputs) == sorted(f"first-{n}" for n in range(4))
    assert PolicyDocument.objects.count() == 1
