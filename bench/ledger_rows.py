#!/usr/bin/env python3
"""Does a budgeted call get slower with the ledger rows already in its budget's window? Each side
is its own OS process on its own store: a fresh embedded SQLite file, or (``DATABASE_URL`` set) a
PostgreSQL database of its own (``{url}_{rows}_{calls}``, created and dropped). With ``--rows``, each
side gets that many charges of the call's own grant written straight into the ledger (inside the
one-day window; as chains where the schema has them); with ``--calls N`` there are two sides, an
empty store and one where N budgeted calls were made (``shared/bench/budget_growth.py``'s question,
asked side by side). Blocks of budgeted calls are then timed in alternating rounds, so a load burst
hits every side.

    python bench/ledger_rows.py --rows 0,10000,100000,1000000
    python bench/ledger_rows.py --calls 20000 [--no-budgets]

Prints the median per call of each side and its ratio to the first (goal: near 1).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUDGETS = """\
      budgets:
        - {metric: count, limit: 100000000000, window: P1D}
        - {metric: amount, limit: 9000000000000, window: P1D}
"""
POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: payer
      subject: {agent: payer}
      actions: ["ledger.pay"]
""" + BUDGETS + """actions:
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


def child(rows: int, calls: int, budgets: bool, block: int) -> None:
    """One side: a store with ``rows`` charges written straight in and ``calls`` budgeted calls made,
    then a block of calls timed each time the parent writes a line."""
    folder = tempfile.mkdtemp(prefix="ctrlrun-ledger-rows-")
    os.chdir(folder)
    with open("ctrlrun.yaml", "w") as f:
        f.write(POLICY if budgets else POLICY.replace(BUDGETS, ""))
    import ctrlrun

    @ctrlrun.protect("ledger.pay", effect="pay:{entry_id}")
    def pay(entry_id: str, amount: int) -> str:
        return "ok"

    with ctrlrun.context(agent="payer"):
        pay(entry_id="warm", amount=1)  # migrated, warm
        if rows:
            _fill(rows)
        for i in range(calls):
            pay(entry_id=f"f{i}", amount=1)
        print("ready", flush=True)
        b = 0
        for _ in sys.stdin:
            start = time.perf_counter()
            for i in range(block):
                pay(entry_id=f"e{b}-{i}", amount=1)
            b += 1
            print((time.perf_counter() - start) / block, flush=True)


def _database(url: str | None, label: str) -> dict[str, str]:
    env = dict(os.environ)
    if url:
        import psycopg

        name = f"{url.rsplit('/', 1)[1]}_{label}"
        with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        env["DATABASE_URL"] = url.rsplit("/", 1)[0] + "/" + name
    return env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="0,10000,100000,1000000", help="charges written straight in, per side")
    ap.add_argument("--calls", type=int, default=0, help="budgeted calls made on every side but the first")
    ap.add_argument("--no-budgets", action="store_true", help="the same policy without its budgets (a control)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--block", type=int, default=40)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        rows, calls = (int(v) for v in args.child.split(":"))
        child(rows, calls, not args.no_budgets, args.block)
        return
    url = os.environ.get("DATABASE_URL")
    sides = [(int(r), 0) for r in args.rows.split(",")]
    if args.calls:
        sides = [(0, 0), (0, args.calls)]
    children = []
    for rows, calls in sides:
        command = [sys.executable, __file__, "--child", f"{rows}:{calls}", "--block", str(args.block)]
        if args.no_budgets:
            command.append("--no-budgets")
        children.append(subprocess.Popen(command, env=_database(url, f"{rows}_{calls}"), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True))
    for process in children:  # filled (each side in its own process, at once)
        if process.stdout.readline().strip() != "ready":
            sys.exit("a side failed to start")
    times: list[list[float]] = [[] for _ in children]
    for _ in range(args.rounds):  # blocks alternate between the sides: a load burst hits them all
        for index, process in enumerate(children):
            process.stdin.write("go\n")
            process.stdin.flush()
            times[index].append(float(process.stdout.readline()))
    for process in children:
        process.stdin.close()
        process.wait()
    base = statistics.median(times[0])
    for (rows, calls), measured in zip(sides, times):
        median = statistics.median(measured)
        what = f"{calls:,} calls made" if calls else f"{rows:>9,} charges in the window"
        print(f"{what}: {median * 1e3:7.2f} ms a call, ratio to the first side {median / base:.2f}", flush=True)
    if url:
        import psycopg

        with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            for rows, calls in sides:
                conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}_{rows}_{calls}" WITH (FORCE)')


if __name__ == "__main__":
    main()
