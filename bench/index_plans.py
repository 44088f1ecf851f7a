#!/usr/bin/env python3
"""Which secondary index each reader of the written tables uses (issue 21, item 3): the query plans.

    python bench/index_plans.py                         # SQLite, 20,000 receipts
    python bench/index_plans.py --backend postgresql    # a scratch database on BENCH_PG_URL's server
    python bench/index_plans.py --receipts 100000 --backend sqlite

In a scratch store (a SQLite file in a temporary folder; a PostgreSQL database this script creates
and drops) it makes a few hundred real calls through ``ctrlrun.Control().call`` (allowed, duplicate,
denied, failed, ambiguous, budgeted, an approval asked for), then appends ``--receipts`` more calls'
rows with bulk INSERTs consistent with the schema (per call: an effect record inserted executing and
moved to committed - a few to failed or ambiguous -, five events, one receipt, two budget charges;
the guard triggers allow exactly that). It then runs every reader of ctrlrun_effectrecord,
ctrlrun_event, ctrlrun_receipt and ctrlrun_budgetledger - the store functions the commands call,
the console's pages through Django's test client - captures each statement they send, and prints
the database's plan of each (SQLite ``EXPLAIN QUERY PLAN``; PostgreSQL ``EXPLAIN``, after
``VACUUM ANALYZE``). The rows' signatures are not valid (plans do not read them). Nothing here is
part of the test suite.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from compare import BUDGET_POLICY
from scratch_site import scratch_site

REPO = Path(__file__).resolve().parent.parent
POLICY = BUDGET_POLICY  # compare.py's allowed_budget policy: a grant with two budgets
TABLES = ("ctrlrun_effectrecord", "ctrlrun_event", "ctrlrun_receipt", "ctrlrun_budgetledger")


def _child(backend: str, receipts: int) -> list[dict]:
    scratch_site("plans-" + backend, POLICY)
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    import ctrlrun
    from ctrlrun import signing, store
    from ctrlrun.canonical import new_id
    from ctrlrun.models import Approval, ChainHead, EffectRecord, Event, Receipt
    from ctrlrun.store import sql as hot

    control = ctrlrun.Control()

    def boom() -> None:
        raise RuntimeError("the remote timed out")

    def not_executed() -> None:
        raise ctrlrun.NotExecuted("refused by the remote")

    for n in range(300):
        args = {"payment_id": f"pay_{n}", "amount": 100}
        executor = boom if n % 50 == 7 else not_executed if n % 50 == 9 else (lambda: 1)
        try:
            control.call("stripe.refund", args, executor, principal="bench-agent")
        except Exception:  # noqa: BLE001 - the ambiguous and failed ones raise, as they should
            pass
        if n % 10 == 0:
            try:
                control.call("stripe.refund", args, lambda: 1, principal="bench-agent")  # a duplicate
            except Exception:  # noqa: BLE001
                pass
        if n % 20 == 0:
            for amount in (10**9, 500_000):  # denied; an approval asked for
                try:
                    control.call("stripe.refund", {"payment_id": f"big_{n}_{amount}", "amount": amount},
                                 lambda: 1, principal="bench-agent")
                except Exception:  # noqa: BLE001
                    pass

    # Bulk rows, consistent with the schema, past the head (plans do not read the chain).
    adapt = store.base.time_param(connection)
    template = Receipt.objects.order_by("seq").last()
    events = list(Event.objects.filter(action_id=template.action_id).order_by("id"))
    seq = Receipt.objects.order_by("-seq").values_list("seq", flat=True).first() or 0
    event_seq = Event.objects.order_by("-seq").values_list("seq", flat=True).first() or 0
    now = store.now()
    start = now - dt.timedelta(days=30)
    step = dt.timedelta(days=30) / max(receipts, 1)
    ev_sql = ('INSERT INTO "ctrlrun_event" ("ts","type","action_id","effect_key","approval_id","data","seq",'
              '"prev_hash","hash") VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)')
    rc_sql = ('INSERT INTO "ctrlrun_receipt" ("receipt_id","seq","action_id","action","agent","decision","result",'
              '"effect_key","ts","document","prev_hash","hash") VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)')
    ef_sql = ('INSERT INTO "ctrlrun_effectrecord" ("effect_key","action","state","action_id","attempt",'
              '"lease_expires_at","reconcile_failures","created_at","updated_at") VALUES (%s,%s,%s,%s,1,%s,0,%s,%s)')
    lg_sql = ('INSERT INTO "ctrlrun_budgetledger" ("grant_id","metric","amount","effect_key","attempt",'
              '"consumed_at") VALUES (%s,%s,%s,%s,1,%s)')
    chunk = 2000
    for begin in range(0, receipts, chunk):
        ev, rc, ef, lg = [], [], [], []
        for i in range(begin, min(begin + chunk, receipts)):
            moment = start + step * i
            key, action_id = f"bulk:{i}", new_id("act_")
            ef.append((key, "stripe.refund", "executing", action_id, adapt(moment + dt.timedelta(minutes=5)),
                       adapt(moment), adapt(moment)))
            lg += [("bench", "count", 1, key, adapt(moment)), ("bench", "amount", 100, key, adapt(moment))]
            for e in events:
                event_seq += 1
                ev.append((adapt(moment), e.type, action_id, key, None, json.dumps(e.data), event_seq, "x", "x"))
            seq += 1
            rc.append((new_id("ctr_"), seq, action_id, template.action, template.agent, template.decision,
                       "committed", key, adapt(moment), template.document, "x", "x"))
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(ef_sql, ef)
            cursor.executemany(ev_sql, ev)
            cursor.executemany(rc_sql, rc)
            cursor.executemany(lg_sql, lg)
    with transaction.atomic(), connection.cursor() as cursor:  # along the state table, as calls move them
        for state, where in (("ambiguous", "%7"), ("failed", "%9"), ("committed", "%")):
            cursor.execute('UPDATE "ctrlrun_effectrecord" SET "state" = %s, "lease_expires_at" = NULL '
                           'WHERE "state" = \'executing\' AND "effect_key" LIKE %s', [state, "bulk:" + where])
    head = ChainHead.objects.get(pk=1)  # moved over the bulk rows and signed, so that calls still run
    with transaction.atomic(), connection.cursor() as cursor:
        mac = signing.sign(store.HEAD_DOMAIN, store.signatures.head_document(seq, head.hash, event_seq, head.event_hash,
                                                                             signing.key_id()))
        cursor.execute('UPDATE "ctrlrun_chainhead" SET "seq" = %s, "event_seq" = %s, "mac" = %s, "key_id" = %s '
                       'WHERE "id" = 1', [seq, event_seq, mac, signing.key_id()])
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")

    some = Receipt.objects.filter(effect_key__startswith="bulk:").order_by("seq")[receipts // 2]
    ambiguous = EffectRecord.objects.filter(state="ambiguous").first()
    approval = Approval.objects.first()
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-password")
    client = Client()
    client.force_login(user)
    ok = lambda response: response.status_code == 200 or sys.exit(f"{response.status_code}")  # noqa: E731
    store.run_check(incremental=True, ran_by="bench")  # the base of the incremental check below
    for n in range(5):
        control.call("stripe.refund", {"payment_id": f"later_{n}", "amount": 100}, lambda: 1, principal="bench-agent")
    year, month = now.year, now.month

    def raw(statement: str, params: list) -> list:
        with store.base.statements() as cursor:
            return cursor.execute(statement, params).fetchall()

    readers = [
        ("store.list_effects() - effects", lambda: store.list_effects()),
        ("store.list_effects('ambiguous') - effects --state", lambda: store.list_effects("ambiguous")),
        ("store.overview() - front page tiles", store.overview),
        ("store.sweep_lapsed() - reconcile", store.sweep_lapsed),
        ("store.reconcile_candidates() - reconcile", store.reconcile_candidates),
        ("store.events_for_action - call page, inspect", lambda: store.events_for_action(some.action_id)),
        ("store.receipts_for_action - call page, inspect, approval page",
         lambda: store.receipts_for_action(some.action_id)),
        ("store.events_for_effect - effect page", lambda: store.events_for_effect(some.effect_key)),
        ("store.receipts_for_effect - effect page", lambda: store.receipts_for_effect(some.effect_key)),
        ("chain.call_from_events - a lapsed pre-pending record",
         lambda: store.chain.call_from_events(some.action_id, some.effect_key)),
        ("sql.LATER_HISTORY - a retry of a failed record",
         lambda: raw(hot.LATER_HISTORY, [some.effect_key])),
        ("store.receipt_documents_since(24h, limit) - front page stats",
         lambda: list(store.receipt_documents_since(now - dt.timedelta(hours=24), limit=5000))),
        ("store.receipt_documents_since(7d) - stats --since", lambda: list(store.receipt_documents_since(
            now - dt.timedelta(days=7)))),
        ("store.list_receipts(last=20) - receipts --last", lambda: store.list_receipts(20)),
        ("store.get_receipt - inspect", lambda: store.get_receipt(some.receipt_id)),
        ("store.verify_incremental - receipts --verify-chain --incremental", store.verify_incremental),
        ("store.budget_usage - report, grants page", lambda: store.budget_usage("bench", "count", 86400, now)),
        ("store.budget_calls - grants page", lambda: store.budget_calls("bench", "count", 86400, now, 20)),
        ("store.charges_of - effects", lambda: store.charges_of(some.effect_key, 1)),
        ("sql.LEDGER_SPENT - every budgeted call's reservation",
         lambda: raw(hot.LEDGER_SPENT, ["bench", "count", now - dt.timedelta(days=1)])),
        ("sql.LEDGER_HELD - a failed attempt's release",
         lambda: raw(hot.LEDGER_HELD, [some.effect_key, 1])),
        ("console /admin/", lambda: ok(client.get("/admin/"))),
        ("console receipt list", lambda: ok(client.get("/admin/ctrlrun/receipt/"))),
        ("console receipt list, a month", lambda: ok(client.get(
            f"/admin/ctrlrun/receipt/?ts__year={year}&ts__month={month}"))),
        ("console receipt list, result=ambiguous", lambda: ok(client.get("/admin/ctrlrun/receipt/?result=ambiguous"))),
        ("console receipt list, by written", lambda: ok(client.get("/admin/ctrlrun/receipt/?o=2"))),
        ("console receipt page", lambda: ok(client.get(f"/admin/ctrlrun/receipt/{some.receipt_id}/change/"))),
        ("console event list", lambda: ok(client.get("/admin/ctrlrun/event/"))),
        ("console event list, a type", lambda: ok(client.get("/admin/ctrlrun/event/?type__exact=EXECUTION_FAILED"))),
        ("console call page", lambda: ok(client.get(f"/admin/ctrlrun/event/call/{some.action_id}/"))),
        ("console effect list", lambda: ok(client.get("/admin/ctrlrun/effectrecord/"))),
        ("console effect list, ambiguous", lambda: ok(client.get("/admin/ctrlrun/effectrecord/?attention=ambiguous"))),
        ("console effect list, lapsed", lambda: ok(client.get("/admin/ctrlrun/effectrecord/?attention=lapsed"))),
        ("console effect list, state=failed", lambda: ok(client.get("/admin/ctrlrun/effectrecord/?state__exact=failed"))),
        ("console effect page", lambda: ok(client.get(f"/admin/ctrlrun/effectrecord/{ambiguous.effect_key}/change/"))),
        ("console approval page", lambda: ok(client.get(f"/admin/ctrlrun/approval/{approval.approval_id}/change/"))),
        ("console budget ledger list", lambda: ok(client.get("/admin/ctrlrun/budgetledger/"))),
        ("console grants page", lambda: ok(client.get("/admin/ctrlrun/budgetledger/grants/"))),
    ]
    out = []
    table_re = re.compile(r'"(' + "|".join(TABLES) + r')"')
    for label, reader in readers:
        with CaptureQueriesContext(connection) as captured:
            reader()
        seen = set()
        for query in captured.captured_queries:
            text = query["sql"]
            if not table_re.search(text) or text in seen or not text.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            seen.add(text)
            with connection.cursor() as cursor:
                if connection.vendor == "sqlite":
                    cursor.execute("EXPLAIN QUERY PLAN " + text)
                    plan = [row[-1] for row in cursor.fetchall()]
                else:
                    cursor.execute("EXPLAIN " + text)
                    plan = [row[0] for row in cursor.fetchall()]
            out.append({"reader": label, "sql": text, "plan": plan})
    indexes = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            indexes[table] = [i for i, c in connection.introspection.get_constraints(cursor, table).items()
                              if c["index"] and not c["primary_key"]]
    out.append({"indexes": indexes})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "postgresql"))
    parser.add_argument("--receipts", type=int, default=20_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.backend, args.receipts)))
        return 0
    env = {**os.environ, "CTRLRUN_SIGNING_KEY": "bench-only-signing-key-0123456789abcdef"}
    scratch = server = None
    if args.backend == "postgresql":
        import psycopg

        server = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
        scratch = f"ctrlrun_bench_plans_{os.getpid()}"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{scratch}"')
        env["DATABASE_URL"] = server.rsplit("/", 1)[0] + "/" + scratch
    else:
        env.pop("DATABASE_URL", None)
    try:
        done = subprocess.run([sys.executable, __file__, "--child", "--backend", args.backend, "--receipts",
                               str(args.receipts)], env=env, cwd=REPO, capture_output=True, text=True)
    finally:
        if scratch:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    results = json.loads(done.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for item in results:
        if "indexes" in item:
            print("\nsecondary indexes:", json.dumps(item["indexes"], indent=1))
            continue
        print(f"\n## {item['reader']}\n   {item['sql'][:300]}")
        for line in item["plan"]:
            print("   |", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
