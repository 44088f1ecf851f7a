"""The seed's example, verbatim, in an empty folder, with the installed package: exact output."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SEED = Path(__file__).resolve().parent.parent / "seed"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE",
                        "CTRLRUN_CONFIG", "PYTHONPATH")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_seed_program_prints_exactly_its_three_lines(tmp_path):
    """The documented program runs unchanged on the embedded SQLite store and prints its lines."""
    shutil.copy(SEED / "ctrlrun.yaml", tmp_path / "ctrlrun.yaml")
    shutil.copy(SEED / "reconcile_refund.py", tmp_path / "reconcile_refund.py")
    result = _run([sys.executable, "reconcile_refund.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (SEED / "expected-output.txt").read_text()
    assert (tmp_path / ".ctrlrun" / "state.db").exists()

    cli = [sys.executable, "-m", "ctrlrun.cli"]
    listed = _run([*cli, "receipts"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    results = [line.split("  ")[3] for line in listed.stdout.splitlines()]
    assert results == ["allow/ambiguous", "allow/blocked"]

    verified = _run([*cli, "receipts", "--verify-chain"], tmp_path)
    assert verified.returncode == 0 and "the chain is intact" in verified.stdout

    first = json.loads(_run([*cli, "receipts", "--json"], tmp_path).stdout.splitlines()[0])
    inspected = _run([*cli, "inspect", first["action_id"]], tmp_path)
    assert "RECONCILIATION_STARTED" in inspected.stdout
    assert "RECONCILIATION_RESOLVED" in inspected.stdout
    assert "outcome=committed" in inspected.stdout
