#!/usr/bin/env python3
"""Does a call get slower as the delegation table grows? Times an allowed call of an agent under a
delegable grant (its policy makes every call read delegations) with no delegations, then with
``--rows`` hops made for *other* agents, and times making those hops (creation reads the parent's
chain, never the table). Embedded SQLite store in a scratch folder, or ``CTRLRUN_STORE_URL``.

    python bench/delegation_growth.py --rows 10000
Prints per-call medians before and after, their ratio (goal: near 1), and hops made per second in
the first and last thousand (goal: near 1; a quadratic creation shows as << 1).
"""
from __future__ import annotations

import argparse
import os
import statistics
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
subject: {agent: worker-%d}
actions: ["ledger.pay"]
expires_at: "2098-01-01T00:00:00Z"
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000, help="hops to make for other agents (default 10000)")
    ap.add_argument("--block", type=int, default=50, help="calls per timed block (default 50)")
    args = ap.parse_args()
    os.chdir(tempfile.mkdtemp(prefix="ctrlrun-delegation-growth-"))
    with open("ctrlrun.yaml", "w") as f:
        f.write(POLICY)
    import ctrlrun
    from ctrlrun.control import default_control

    @ctrlrun.protect("ledger.pay", effect="pay:{entry_id}")
    def pay(entry_id: str) -> str:
        return "ok"

    def blocks(tag: str) -> float:
        times = []
        for b in range(6):
            t = time.perf_counter()
            for i in range(args.block):
                pay(entry_id=f"{tag}-{b}-{i}")
            times.append((time.perf_counter() - t) / args.block)
        return statistics.median(times)

    control = default_control()
    with ctrlrun.context(agent="orchestrator"):
        pay(entry_id="warm")
        before = blocks("before")
        rates = []
        started = time.perf_counter()
        for n in range(args.rows):
            if n % 1000 == 0:
                mark = time.perf_counter()
            control.hop("orchestrator", HOP % n, by="orchestrator")
            if n % 1000 == 999:
                rates.append(1000 / (time.perf_counter() - mark))
        made = time.perf_counter() - started
        after = blocks("after")
    print(f"allowed call: {before * 1e6:.0f} us with no delegations, {after * 1e6:.0f} us with {args.rows} hops "
          f"of other agents (made in {made:.1f} s)")
    print(f"delegation_growth after/before {after / before:.2f}")
    if len(rates) >= 2:
        print(f"hops made per second: {rates[0]:.0f} in the first thousand, {rates[-1]:.0f} in the last "
              f"(last/first {rates[-1] / rates[0]:.2f})")


if __name__ == "__main__":
    main()
