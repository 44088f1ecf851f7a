"""A scratch ctrlrun site for a bench's child process: a fresh folder holding ``policy`` as its
``ctrlrun.yaml``, Django set up on the test settings (the database the child's environment names),
the test environment's client allowed, and every migration applied. Shared by ``front_page.py`` and
``index_plans.py``; ``fill_chain`` writes a long receipt chain straight into it (``front_page.py``,
``prune_year.py``)."""
from __future__ import annotations

import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def scratch_site(name: str, policy: str) -> Path:
    """Set the site up in this process (once) and return its folder."""
    sys.path.insert(0, str(REPO))
    folder = Path(tempfile.mkdtemp(prefix=f"ctrlrun-bench-{name}-"))
    (folder / "ctrlrun.yaml").write_text(policy)
    os.environ["CTRLRUN_POLICY"] = str(folder / "ctrlrun.yaml")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    settings.CTRLRUN_POLICY = str(folder / "ctrlrun.yaml")
    settings.ALLOWED_HOSTS = ["*"]
    setup_test_environment()
    call_command("migrate", verbosity=0)
    return folder


def fill_chain(receipts: int, start: dt.datetime, step: dt.timedelta) -> float:
    """Seconds taken to make the chain ``receipts`` long: one real call of ``bench.note`` (the policy must
    allow it), then receipts 2..N copied from its receipt and written straight into the table in batches,
    receipt ``seq`` at ``start + step * seq``, and the head signed at the end (PostgreSQL: analysed)."""
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
    return time.perf_counter() - started
