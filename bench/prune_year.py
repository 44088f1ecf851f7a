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

from scratch_site import scratch_site

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

    from django.db import connection, transaction

    import ctrlrun
    from ctrlrun import signing, store
    from ctrlrun.canonical import evidence_time, new_id
    from ctrlrun.models import ChainHead, Receipt
    from ctrlrun.receipts import dump_receipt, receipt_hash

    @ctrlrun.protect("bench.note")
    def note(n: int) -> int:
        return n

    with ctrlrun.context(agent="bench-agent"):
        note(n=0)
    template = json.loads(Receipt.objects.get(seq=1).document)
    prev, started = ChainHead.objects.get(pk=1).hash, time.perf_counter()
    adapt = store.base.time_param(connection)
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=425)
    step = dt.timedelta(days=365) / receipts
    insert = ('INSERT INTO "ctrlrun_receipt" ("receipt_id","seq","action_id","action","agent","decision","result",'
              '"effect_key","ts","document","prev_hash","hash") VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)')
    chunk: list[tuple] = []
    for seq in range(2, receipts + 1):
        moment = start + step * seq
        doc = dict(template)
        doc.update(receipt_id=new_id("ctr_"), action_id=new_id("act_"), arguments={"n": seq},
                   started_at=evidence_time(moment), finished_at=evidence_time(moment), seq=seq, prev_hash=prev)
        digest = receipt_hash(doc, trusted=True)
        chunk.append((doc["receipt_id"], seq, doc["action_id"], doc["action"], doc["principal"]["agent"],
                      doc["decision"], doc["result"], None, adapt(moment), dump_receipt(doc), prev, digest))
        prev = digest
        if len(chunk) == 5000 or seq == receipts:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.executemany(insert, chunk)
            chunk = []
    head = ChainHead.objects.get(pk=1)
    with transaction.atomic(), connection.cursor() as cursor:
        mac = signing.sign(store.HEAD_DOMAIN, store.signatures.head_document(receipts, prev, head.event_seq,
                                                                             head.event_hash, signing.key_id()))
        cursor.execute('UPDATE "ctrlrun_chainhead" SET "seq" = %s, "hash" = %s, "mac" = %s, "key_id" = %s '
                       'WHERE "id" = 1', [receipts, prev, mac, signing.key_id()])
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
    return {"fill_s": time.perf_counter() - started}


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
