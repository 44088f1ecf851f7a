#!/usr/bin/env python3
"""CTRLRUN_PG_PREPARE on against off, in ONE process, on PostgreSQL (docs/settings.md says what it does).

    python bench/prepare_ab.py                       # blocks of 25 calls, 30 blocks a side and scenario
    python bench/prepare_ab.py --block 25 --blocks 30 --pg-url postgresql://postgres@127.0.0.1:5432

Two ``compare.py`` runs (one with the variable set, one without) are minutes apart, and on a shared
machine the load moves more between them than preparing saves. Here blocks of protected calls with the
setting on alternate with blocks with it off (which goes first alternates too), in one process on one
connection to a scratch database (created, then dropped), so both sides share whatever the machine is
doing. The scenarios are ``compare.py``'s: ``allowed`` (a fresh key each call), ``duplicate`` (a key
already committed), ``denied`` (above every band). It prints, per scenario, the median µs per call of
each side's blocks. A measurement, never a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's ctrlrun
sys.path.insert(0, str(HERE))
from compare import POLICY  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", type=int, default=25, help="calls per block (default 25)")
    parser.add_argument("--blocks", type=int, default=30, help="blocks per side and scenario (default 30)")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432",
                        help="server URL without a database name")
    args = parser.parse_args()

    import psycopg

    name = f"ctrlrun_prepare_ab_{os.getpid()}"
    with psycopg.connect(f"{args.pg_url}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    os.environ["CTRLRUN_STORE_URL"] = f"{args.pg_url}/{name}"
    os.environ.pop("DATABASE_URL", None)
    os.chdir(tempfile.mkdtemp(prefix="prepare_ab_"))
    Path("ctrlrun.yaml").write_text(POLICY)
    try:
        return _measure(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{args.pg_url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _measure(args: argparse.Namespace) -> int:
    import ctrlrun
    from ctrlrun import conf

    refund = ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")(
        lambda payment_id, amount: {"id": f"re_{payment_id}", "amount": amount})
    fresh = iter(range(10**9))

    def allowed(n: int) -> None:
        for _ in range(n):
            refund(payment_id=f"p{next(fresh)}", amount=100)

    def duplicate(n: int) -> None:
        for _ in range(n):
            try:
                refund(payment_id="warm", amount=1)
            except ctrlrun.DuplicateEffect:
                pass

    def denied(n: int) -> None:
        for _ in range(n):
            try:
                refund(payment_id="big", amount=10**9)
            except ctrlrun.ActionDenied:
                pass

    def side(on: bool) -> None:
        os.environ["CTRLRUN_PG_PREPARE"] = "1" if on else "0"
        conf.forget_cached_settings()

    with ctrlrun.context(agent="bench-agent"):
        refund(payment_id="warm", amount=1)  # configures the store (migrations), untimed
        print(f"{args.blocks} blocks of {args.block} calls a side; median µs per call")
        print("| scenario | prepared (on) | unprepared (off) | off - on | on/off |")
        print("|---|--:|--:|--:|--:|")
        for label, run in (("allowed", allowed), ("duplicate", duplicate), ("denied", denied)):
            per_call: dict[bool, list[float]] = {True: [], False: []}
            for on in (True, False):
                side(on)
                run(10)  # warm each side
            for index in range(args.blocks):
                for on in ((True, False) if index % 2 else (False, True)):
                    side(on)
                    start = time.perf_counter()
                    run(args.block)
                    per_call[on].append((time.perf_counter() - start) / args.block * 1e6)
            on_us, off_us = statistics.median(per_call[True]), statistics.median(per_call[False])
            print(f"| {label} | {on_us:.0f} | {off_us:.0f} | {off_us - on_us:+.0f} | {on_us / off_us:.2f}x |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
