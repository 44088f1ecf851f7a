"""Real OS processes racing for the same effect keys on the shared test store."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ctrlrun.models import EffectRecord, Receipt

from tests.support import store_environment

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

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  ledger.post:
    effect: "post:{entry_id}"
    decision: allow
"""


@pytest.mark.slow
def test_racing_processes_execute_each_key_once(transactional_db, tmp_path):
    """Four processes race for the same 25 keys: each key runs exactly once, every loser is a duplicate."""
    workers, keys = 4, 25
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    (tmp_path / "racer.py").write_text(RACER)
    env = store_environment()
    env["CTRLRUN_CONFIG"] = str(tmp_path / "ctrlrun.yaml")
    start_at = time.time() + 4.0  # every worker has imported Django and warmed up by then
    procs = [
        subprocess.Popen([sys.executable, "racer.py", str(start_at), str(keys), str(n)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(workers)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    counts = [json.loads(out) for out, _ in outputs]
    executed = [line for line in (tmp_path / "executions.log").read_text().split() if line.startswith("k")]
    assert sorted(executed) == sorted(f"k{k}" for k in range(keys))  # each exactly once
    assert sum(c["ran"] for c in counts) == keys
    assert sum(c["duplicate"] for c in counts) == keys * (workers - 1)
    assert [c["other"] for c in counts] == [[]] * workers
    assert EffectRecord.objects.filter(state="committed").count() == keys + workers
    seqs = list(Receipt.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) == keys * workers + workers


DISTINCT = RACER.replace('post(entry_id=f"k{k}")', 'post(entry_id=f"w{worker}-k{k}")')


@pytest.mark.slow
def test_processes_on_distinct_keys_all_execute_once(transactional_db, tmp_path):
    """Four processes on their own keys: every call executes exactly once, and the chain stays linear."""
    from ctrlrun import store

    workers, keys = 4, 25
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    (tmp_path / "racer.py").write_text(DISTINCT)
    env = store_environment()
    env["CTRLRUN_CONFIG"] = str(tmp_path / "ctrlrun.yaml")
    start_at = time.time() + 4.0
    procs = [
        subprocess.Popen([sys.executable, "racer.py", str(start_at), str(keys), str(n)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(workers)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    counts = [json.loads(out) for out, _ in outputs]
    assert [c["ran"] for c in counts] == [keys] * workers
    assert [c["duplicate"] for c in counts] == [0] * workers
    executed = [line for line in (tmp_path / "executions.log").read_text().split() if "-k" in line]
    assert sorted(executed) == sorted(f"w{n}-k{k}" for n in range(workers) for k in range(keys))
    report = store.verify()
    assert report.ok and report.verified == workers * keys + workers
