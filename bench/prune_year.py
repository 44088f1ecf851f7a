#!/usr/bin/env python3
"""A year of receipts, pruned (issue 24, docs/retention.md).

    python bench/prune_year.py                                   # 1,000,000 receipts, SQLite
    python bench/prune_year.py --receipts 200000 --backends sqlite,postgresql

For each backend, in a scratch store: a child process writes ``--receipts`` receipts directly (bulk
INSERTs, a *valid* chain hashed with ctrlrun's own ``receipt_hash``, spread over the year that ended
60 days ago, the head moved and signed), then runs ``retention.prune`` of
everything older than 30 days but the last 1,000 (re-hashing what it deletes, anchoring the
checkpoint to a file, in batches) and reports its time and the process's peak RSS (``ru_maxrss``,
Django included) before and after the prune; then ``store.verify()`` from the checkpoint. Nothing
here is a test.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scratch_site import fill_chain, scratch_site

REPO = Path(__file__).resolve().parent.parent
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  bench.note:
    decision: allow
"""


def _fill(backend: str, receipts: int) -> dict:
    scratch_site("prune-" + backend, POLICY)
    import datetime as dt

    # A year of receipts, ending two months ago: all of it older than a 30-day retention.
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=425)
    return {"fill_s": fill_chain(receipts, start, dt.timedelta(days=365) / receipts)}


def _prune(backend: str, receipts: int, anchors: str) -> dict:
    from ctrlrun import anchor, retention, store

    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    through = receipts - 1000
    started = time.perf_counter()
    result = retention.prune(through=through, older_than=retention.parse_duration("30d"), by="bench",
                             reason="a year of receipts", anchor=anchor.FileProvider(anchors))
    prune_s = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    report = store.verify()
    return {"prune_s": prune_s, "peak_rss_before_prune_mb": before_mb, "peak_rss_after_prune_mb": peak_mb,
            "deleted": result.receipts_deleted,
            "checkpoint": result.checkpoint["seq"], "verify_s": time.perf_counter() - started,
            "verify_ok": report.ok, "left": report.chained, "anchored": result.anchored}


def _pg_database(url: str, name: str, create: bool) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receipts", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--anchors", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        out = _fill(args.child, args.receipts)
        out.update(_prune(args.child, args.receipts, args.anchors))
        print(json.dumps(out))
        return 0
    for backend in args.backends.split(","):
        env = {**os.environ, "CTRLRUN_SIGNING_KEY": "bench-only-signing-key-0123456789abcdef"}
        scratch = None
        if backend == "postgresql":
            server = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
            scratch = f"h_retention_bench_{os.getpid()}"
            _pg_database(server, scratch, create=True)
            env["DATABASE_URL"] = server.rsplit("/", 1)[0] + "/" + scratch
        else:
            env.pop("DATABASE_URL", None)
        try:
            found: dict = {"backend": backend, "receipts": args.receipts}
            with tempfile.TemporaryDirectory() as folder:
                done = subprocess.run([sys.executable, __file__, "--child", backend, "--receipts",
                                       str(args.receipts), "--anchors", str(Path(folder) / "anchors.jsonl")],
                                      env=env, cwd=REPO, capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"Error: the {backend} run failed: {done.stderr.strip()[-2000:]}", file=sys.stderr)
                    return 1
                found.update(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(found))
        finally:
            if scratch:
                _pg_database(server, scratch, create=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
