#!/usr/bin/env python3
"""Does a budgeted call get slower with the ledger rows already in its budget's window? For each
``--rows`` N, a fresh embedded SQLite store (or the empty PostgreSQL database ``DATABASE_URL`` names,
one per N: ``{url}_{N}``, created and dropped) gets N charges of the call's own grant written straight
into the ledger (all inside the one-day window; as chains where the schema has them), then the
median of blocks of budgeted calls is timed. Each N runs in its own OS process.

    python bench/ledger_rows.py --rows 0,10000,100000,1000000

Prints the median per call for each N and its ratio to N = 0 (goal: near 1).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
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
    - id: payer
      subject: {agent: payer}
      actions: ["ledger.pay"]
      budgets:
        - {metric: count, limit: 100000000000, window: P1D}
        - {metric: amount, limit: 9000000000000, window: P1D}
actions:
  ledger.pay:
    effect: "pay:{entry_id}"
    decision: allow
"""


def _fill(rows: int) -> None:
    from django.db import connection, transaction

    from ctrlrun import guards

    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(cursor, "ctrlrun_budgetledger")}
    chained = "cum" in columns
    now = dt.datetime.now(dt.timezone.utc)  # after the warm call's charges: the chains go on in time
    stamp = now.strftime("%Y-%m-%d %H:%M:%S.%f") + ("" if connection.vendor == "sqlite" else "+00")
    with transaction.atomic():
        guards.remove(connection)  # written straight, as a filled store holds them (the guard is put back)
        with connection.cursor() as cursor:
            for metric in ("count", "amount"):
                batch = []
                for n in range(2, rows + 2):  # the warm call's charge of 1 is the first of each chain
                    values = ["payer", metric, 1, f"filled:{n}", 1, stamp]
                    batch.append(values + [n, n] if chained else values)
                    if len(batch) == 5000 or n == rows + 1:
                        marks = ",".join(["%s"] * (8 if chained else 6))
                        cursor.executemany(
                            'INSERT INTO "ctrlrun_budgetledger" ("grant_id", "metric", "amount", "effect_key", '
                            '"attempt", "consumed_at"' + (', "n", "cum"' if chained else "") + f") VALUES ({marks})",
                            batch)
                        batch = []
        guards.install(connection, guards.CURRENT)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute('ANALYZE "ctrlrun_budgetledger"')


def child(rows: int, blocks: int, block: int) -> None:
    folder = tempfile.mkdtemp(prefix="ctrlrun-ledger-rows-")
    os.chdir(folder)
    with open("ctrlrun.yaml", "w") as f:
        f.write(POLICY)
    import ctrlrun

    @ctrlrun.protect("ledger.pay", effect="pay:{entry_id}")
    def pay(entry_id: str, amount: int) -> str:
        return "ok"

    with ctrlrun.context(agent="payer"):
        pay(entry_id="warm", amount=1)  # migrated, warm
        _fill(rows)
        times = []
        for b in range(blocks):
            start = time.perf_counter()
            for i in range(block):
                pay(entry_id=f"e{b}-{i}", amount=1)
            times.append((time.perf_counter() - start) / block)
    print(json.dumps({"rows": rows, "median_s": statistics.median(times)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="0,10000,100000,1000000")
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--block", type=int, default=40)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.blocks, args.block)
        return
    url = os.environ.get("DATABASE_URL")
    results = {}
    for rows in [int(r) for r in args.rows.split(",")]:
        env = dict(os.environ)
        if url:
            import psycopg

            name = f"{url.rsplit('/', 1)[1]}_{rows}"
            admin = url.rsplit("/", 1)[0] + "/postgres"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                conn.execute(f'CREATE DATABASE "{name}"')
            env["DATABASE_URL"] = url.rsplit("/", 1)[0] + "/" + name
        done = subprocess.run([sys.executable, __file__, "--child", str(rows), "--blocks", str(args.blocks),
                               "--block", str(args.block)], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(done.stderr)
        results[rows] = json.loads(done.stdout.strip().splitlines()[-1])["median_s"]
        if url:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        base = results[min(results)]
        print(f"ledger rows {rows:>9,} per grant metric: {results[rows] * 1e3:7.2f} ms a call, "
              f"ratio to empty {results[rows] / base:.2f}", flush=True)


if __name__ == "__main__":
    main()
