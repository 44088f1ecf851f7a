"""bench/compare.py's worker mode with the in-process floors: the JSON line it prints carries the
floors' keys (bench/inprocess_floor.py). Speed is measured by the benchmark, never asserted here:
the numbers are only checked to be there and positive.

The worker runs as compare.py runs it, in a process of its own with this checkout on PYTHONPATH,
in a fresh folder, on SQLite (its own store and the floors' scratch files inside that folder).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO

pytestmark = pytest.mark.slow

COMPARE = REPO / "bench" / "compare.py"
RESULT_MARK = "@@compare-result "
SCRUBBED = ("CTRLRUN_STORE_URL", "DATABASE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG", "CTRLRUN_ENVIRONMENT",
            "DJANGO_SETTINGS_MODULE", "PYTHONPATH")


def run_worker(tmp_path, scenario: str, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, str(COMPARE), "--worker", scenario, "--dir", str(tmp_path),
                           "--calls", "6", "--rounds", "2", *extra], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    assert len(lines) == 1, proc.stdout[-2000:]
    return json.loads(lines[0][len(RESULT_MARK):])


@pytest.mark.parametrize("scenario, kind", [("allowed", "floor_allowed"), ("duplicate", "floor_refused"),
                                            ("allowed_budget", "floor_allowed")])
def test_worker_prints_the_in_process_floor_keys(tmp_path, scenario, kind):
    result = run_worker(tmp_path, scenario, "--floor-block", "3")
    assert "inproc_floor_error" not in result, result.get("inproc_floor_error")
    assert result["inproc_floor_kind"] == kind
    assert result["floor_block"] == 3 and result["blocks_per_round"] == 2
    for key in ("inproc_floor_us", "own_floor_us"):
        assert result[key] > 0
        assert len(result[key.replace("_us", "_per_round_us")]) == 2
    # What the own floor replays: an allowed call's two transactions, a refusal's one (a budgeted call's
    # ledger rows continue their chain on every replay: the database refuses a reused position).
    assert result["own_floor_commits"] == (2 if scenario.startswith("allowed") else 1)
    assert result["own_floor_statements"] >= 4
    assert (tmp_path / "inproc-floor.db").exists() and (tmp_path / "own-floor.db").exists()


def test_worker_without_the_in_process_floor_prints_none_of_its_keys(tmp_path):
    result = run_worker(tmp_path, "allowed", "--floor-block", "0")
    assert result["median_us"] > 0
    assert not [key for key in result if "floor" in key]


def test_a_floor_script_whose_schema_differs_is_named(tmp_path):
    script = tmp_path / "other_floor.py"
    script.write_text('SCHEMA = ["CREATE TABLE other (k TEXT)"]\n')
    work = tmp_path / "work"
    work.mkdir()
    result = run_worker(work, "denied", "--floor-block", "3", "--floor-script", str(script))
    assert "SCHEMA differs" in result["inproc_floor_note"]
    assert result["inproc_floor_us"] > 0  # measured with the replica all the same
