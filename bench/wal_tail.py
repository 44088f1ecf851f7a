#!/usr/bin/env python3
"""The tail of allowed calls on a fresh SQLite store, with the background WAL checkpointer on and off.

    python bench/wal_tail.py --calls 3000 --pairs 3

Each run is this file in worker mode, in a fresh folder (its own ``.ctrlrun/state.db``), with
``CTRLRUN_SQLITE_CHECKPOINT_SECONDS`` set to the interval (on) or ``0`` (off: SQLite's automatic
checkpoint inside the COMMIT that crosses 1000 WAL pages); on and off alternate, ``--pairs`` times.
Each worker times every call on its own (perf_counter around the call) and prints the mean, p50,
p99, p99.9 and max in µs, how many calls took over 5 and over 10 ms, and the WAL's final size in pages.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POLICY = 'schema: ctrlrun.policy/v2\nactions:\n  email.send:\n    effect: "email:{msg_id}"\n    decision: allow\n'


def worker(calls: int) -> None:
    import ctrlrun

    @ctrlrun.protect("email.send")
    def send(msg_id: str) -> str:
        return msg_id

    times = []
    with ctrlrun.context(agent="bench"):
        send(msg_id="warm")
        for n in range(calls):
            started = time.perf_counter()
            send(msg_id=f"m{n}")
            times.append(time.perf_counter() - started)
    times.sort()

    def at(q: float) -> int:
        return round(times[min(len(times) - 1, int(q * len(times)))] * 1e6)

    state = Path(os.environ["CTRLRUN_STATE"])
    print(json.dumps({"mean": round(sum(times) / len(times) * 1e6), "p50": at(0.5), "p99": at(0.99),
                      "p99.9": at(0.999), "max": round(times[-1] * 1e6), ">5ms": sum(t > 0.005 for t in times),
                      ">10ms": sum(t > 0.010 for t in times),
                      "wal_pages": os.path.getsize(str(state) + "-wal") // 4096}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--interval", default="0.2", help="CTRLRUN_SQLITE_CHECKPOINT_SECONDS when on")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.calls)
        return
    for pair in range(args.pairs):
        for label, value in (("on", args.interval), ("off", "0")) if pair % 2 == 0 else (("off", "0"), ("on", args.interval)):
            with tempfile.TemporaryDirectory(prefix="wal-tail-") as folder:
                (Path(folder) / "ctrlrun.yaml").write_text(POLICY)
                env = {k: v for k, v in os.environ.items() if not k.startswith(("CTRLRUN_", "DJANGO_"))
                       and k not in ("DATABASE_URL", "PYTHONPATH")}
                env.update(PYTHONPATH=str(REPO), CTRLRUN_CONFIG=str(Path(folder) / "ctrlrun.yaml"),
                           CTRLRUN_STATE=str(Path(folder) / "state.db"), CTRLRUN_SQLITE_CHECKPOINT_SECONDS=value)
                done = subprocess.run([sys.executable, __file__, "--worker", "--calls", str(args.calls)], cwd=folder,
                                      env=env, capture_output=True, text=True, check=True)
                print(f"{label:3} {done.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
