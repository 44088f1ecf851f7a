"""bench/gateway_throughput.py runs end to end with tiny numbers: the upstream, the gateway and the
worker as OS processes on a scratch SQLite store, every call checked by the bench itself. Speed is
measured by the benchmark, never asserted here: the numbers are only checked to be there."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO

pytestmark = pytest.mark.slow


def test_the_gateway_bench_runs_and_prints_its_table():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gateway_throughput.py"), "--db", "sqlite",
                           "--block", "2", "--blocks", "2", "--warmup", "1", "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "sqlite" in line]
    assert [row.split("|")[1].strip() for row in rows] == ["upstream", "acall", "gateway"]
    numbers = json.loads(done.stdout[done.stdout.index("{"):])
    for way in ("upstream", "acall", "gateway"):
        assert numbers["sqlite"][way]["calls"] == 4
        assert numbers["sqlite"][way]["calls_per_s"] > 0 and numbers["sqlite"][way]["p99_us"] > 0
