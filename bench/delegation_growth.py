#!/usr/bin/env python3
"""Does a call get slower as the delegation table grows? An allowed call of an agent under a delegable
grant (its policy makes every call read delegations) is timed on a store with no delegations and on
one with ``--rows`` hops made for *other* agents, in alternating rounds (a load burst hits both
sides); so is making hops. Each side is its own OS process on its own embedded SQLite store in a
scratch folder.

    python bench/delegation_growth.py --rows 10000

Prints per-call medians on each side and their ratio (goal: near 1), and hops made per second on
each side (goal: near 1; a creation that reads the table shows as << 1).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: orchestrator
      subject: {agent: orchestrator}
      actions: ["ledger.pay"]
      delegable: true
      expires_at: "2099-01-01T00:00:00Z"
actions:
  ledger.pay:
    effect: "pay:{entry_id}"
    decision: allow
"""

HOP = """\
subject: {agent: worker-%s}
actions: ["ledger.pay"]
expires_at: "2098-01-01T00:00:00Z"
"""


def side(folder: str, task: str, tag: str, count: int) -> None:
    """In a child process: ``build`` makes ``count`` hops; ``calls`` prints the median µs of an allowed
    call over five blocks of ``count``; ``hops`` prints hops made per second over ``count``."""
    os.chdir(folder)
    import ctrlrun
    from ctrlrun.control import default_control

    @ctrlrun.protect("ledger.pay", effect="pay:{entry_id}")
    def pay(entry_id: str) -> str:
        return "ok"

    control = default_control()
    with ctrlrun.context(agent="orchestrator"):
        pay(entry_id=f"{tag}-{task}-warm")
        if task == "build":
            for n in range(count):
                control.hop("orchestrator", HOP % n, by="orchestrator")
        elif task == "calls":
            times = []
            for block in range(5):
                started = time.perf_counter()
                for i in range(count):
                    pay(entry_id=f"{tag}-{block}-{i}")
                times.append((time.perf_counter() - started) / count)
            print(statistics.median(times) * 1e6)
        else:
            started = time.perf_counter()
            for n in range(count):
                control.hop("orchestrator", HOP % f"{tag}-{n}", by="orchestrator")
            print(count / (time.perf_counter() - started))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--side":
        side(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000, help="hops made for other agents (default 10000)")
    ap.add_argument("--block", type=int, default=40, help="calls per timed block (default 40)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per side (default 3)")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="ctrlrun-delegation-growth-")
    folders = {"empty": os.path.join(scratch, "empty"), "full": os.path.join(scratch, "full")}

    def run(folder: str, task: str, tag: str, count: int) -> float:
        out = subprocess.run([sys.executable, __file__, "--side", folder, task, tag, str(count)], check=True,
                             capture_output=True, text=True).stdout.split()
        return float(out[-1]) if out else 0.0

    for folder in folders.values():
        os.makedirs(folder)
        with open(os.path.join(folder, "ctrlrun.yaml"), "w") as f:
            f.write(POLICY)
    started = time.perf_counter()
    print(f"making {args.rows} hops for other agents ...", file=sys.stderr, flush=True)
    run(folders["full"], "build", "build", args.rows)
    print(f"made in {time.perf_counter() - started:.1f} s; timing {args.rounds} alternating rounds", file=sys.stderr)
    calls: dict[str, list[float]] = {"empty": [], "full": []}
    hops: dict[str, list[float]] = {"empty": [], "full": []}
    for round_ in range(args.rounds):
        for name, folder in folders.items():
            calls[name].append(run(folder, "calls", f"{name}{round_}", args.block))
            hops[name].append(run(folder, "hops", f"{name}{round_}", 200))
    call = {name: statistics.median(values) for name, values in calls.items()}
    made = {name: statistics.median(values) for name, values in hops.items()}
    print(f"allowed call: {call['empty']:.0f} us with no delegations, {call['full']:.0f} us with {args.rows} hops "
          f"of other agents")
    print(f"delegation_growth full/empty {call['full'] / call['empty']:.2f}")
    print(f"hops made per second: {made['empty']:.0f} beside no delegations, {made['full']:.0f} beside {args.rows} "
          f"(full/empty {made['full'] / made['empty']:.2f})")


if __name__ == "__main__":
    main()
