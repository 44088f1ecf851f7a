#!/usr/bin/env python3
"""The console's front page and the chain checks on a large store (issue 9).

    python bench/front_page.py                       # 1,000,000 receipts, SQLite and PostgreSQL
    python bench/front_page.py --receipts 100000 --backends sqlite
    BENCH_PG_URL=postgresql://postgres@127.0.0.1:5432/postgres python bench/front_page.py

For each backend, in a scratch store (a SQLite file in a temporary folder; a PostgreSQL database
this script creates and drops, on the server of ``BENCH_PG_URL``), it:

1. migrates, makes one real protected call (its receipt is the template), then appends
   ``--receipts`` - 1 receipts with bulk INSERTs: a *valid* chain, each document hashed with
   ctrlrun's own ``receipt_hash`` and linked to the one before, the head moved and signed;
2. times the front page (``GET /admin/`` with Django's test client, logged-in superuser; median
   of ``--loads``) with no check recorded, and the ``COUNT(*)`` the old overview paid per load;
3. times the first ``--incremental`` check (nothing recorded yet, so it walks the whole chain in
   batches, and records an intact check at the head);
4. makes 1,000 more real protected calls (``ctrlrun.protect``: events, effect records and all)
   and times the incremental check of them;
5. times a full check (``store.verify()``, as ``receipts --verify-chain`` and the console's button
   run it), unless ``--skip-full``; and the front page again, now showing the last check.

It prints a table (and, with ``--json``, the numbers). Nothing here is part of the test suite.
Each backend runs in a child process of this script (Django is set up once per process).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scratch_site import fill_chain, scratch_site

REPO = Path(__file__).resolve().parent.parent
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  bench.note:
    decision: allow
  bench.send:
    effect: "send:{n}"
    decision: allow
"""


def _child(backend: str, receipts: int, loads: int, skip_full: bool) -> dict:
    scratch_site("front-" + backend, POLICY)
    import datetime as dt

    from django.contrib.auth import get_user_model
    from django.test import Client

    import ctrlrun
    from ctrlrun import store
    from ctrlrun.models import Receipt

    out: dict = {"backend": backend, "receipts": receipts}

    @ctrlrun.protect("bench.send")
    def send(n: int) -> int:
        return n

    out["fill_s"] = fill_chain(receipts, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), dt.timedelta(milliseconds=1))

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-password")
    client = Client()
    client.force_login(user)

    def front_page() -> float:
        times = []
        for _ in range(loads + 1):
            begin = time.perf_counter()
            response = client.get("/admin/")
            times.append(time.perf_counter() - begin)
            assert response.status_code == 200 and b"ctrlrun-overview" in response.content, response.status_code
        return statistics.median(times[1:])  # the first load warms caches and connections

    out["front_unchecked_s"] = front_page()
    begin = time.perf_counter()
    Receipt.objects.count()
    out["count_s"] = time.perf_counter() - begin

    def timed_check(incremental: bool) -> tuple[float, bool]:
        begin, clock = time.perf_counter(), time.monotonic()
        checked_at = store.now()
        report = store.verify_incremental() if incremental else store.verify()
        store.record_check(report, started=checked_at, duration=time.monotonic() - clock, ran_by="bench")
        return time.perf_counter() - begin, report.ok

    out["first_incremental_s"], ok = timed_check(True)
    assert ok
    with ctrlrun.context(agent="bench-agent"):
        for n in range(1000):
            send(n=n)
    out["incremental_1000_s"], ok = timed_check(True)
    assert ok
    if not skip_full:
        out["full_s"], ok = timed_check(False)
        assert ok
    out["front_checked_s"] = front_page()
    page = client.get("/admin/").content.decode()
    out["tile"] = " ".join(page.split('class="tile chain')[1].split("</a>")[0].split(">", 1)[1].split())
    return out


def _pg_database(url: str, name: str, create: bool) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--loads", type=int, default=5, help="front page loads timed (median)")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--skip-full", action="store_true", help="no full check (it holds the store in memory)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.receipts, args.loads, args.skip_full)))
        return 0
    results = []
    for backend in args.backends.split(","):
        env = {**os.environ, "CTRLRUN_SIGNING_KEY": "bench-only-signing-key-0123456789abcdef"}
        scratch = None
        if backend == "postgresql":
            server = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
            scratch = f"ctrlrun_bench_front_{os.getpid()}"
            _pg_database(server, scratch, create=True)
            env["DATABASE_URL"] = server.rsplit("/", 1)[0] + "/" + scratch
        else:
            env.pop("DATABASE_URL", None)
        try:
            command = [sys.executable, __file__, "--child", backend, "--receipts", str(args.receipts),
                       "--loads", str(args.loads)] + (["--skip-full"] if args.skip_full else [])
            done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"Error: the {backend} run failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            if scratch:
                _pg_database(server, scratch, create=False)
    if args.json:
        print(json.dumps(results, indent=2))
    rows = [("fill (bulk INSERT, valid chain)", "fill_s"), ("front page, never checked (median)", "front_unchecked_s"),
            ("front page, last check shown (median)", "front_checked_s"),
            ("COUNT(*) of receipts (the old overview's, per load)", "count_s"),
            ("first --incremental (no check yet: the whole chain, in batches)", "first_incremental_s"),
            ("--incremental after 1,000 more calls", "incremental_1000_s"), ("full check (store.verify)", "full_s")]
    print(f"{'with ' + format(args.receipts, ',') + ' receipts':<66}" + "".join(f"{r['backend']:>14}" for r in results))
    for label, key in rows:
        cells = "".join(f"{_seconds(r.get(key)):>14}" for r in results)
        print(f"{label:<66}{cells}")
    for r in results:
        print(f"{r['backend']} tile: {r['tile']}")
    return 0


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
