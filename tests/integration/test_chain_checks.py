"""Recorded chain checks on a real database (issue 9): ``receipts --verify-chain`` records each
result, ``--incremental`` checks only what was added since the last intact check and records it,
the record is append-only and signed, and what an incremental check cannot see is said (and a full
check still sees it)."""
from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

import ctrlrun
from ctrlrun import guard, receipts, store
from ctrlrun.models import ChainCheck, EffectRecord, Receipt
from tests.support import REFUND_POLICY
from tests.support import evidence_unguarded, script_environment

pytestmark = pytest.mark.usefixtures("store_db")


def pay(refund, n: int, start: int = 0) -> None:
    with ctrlrun.context(agent="support-agent"):
        for i in range(start, start + n):
            refund(payment_id=f"txn_{i}", amount=100)


def check(*args: str) -> tuple[list[str], str, CommandError | None]:
    """Run ``receipts --verify-chain ARGS``: (stdout lines, stderr, the error if it exited non-zero)."""
    out, err = StringIO(), StringIO()
    try:
        call_command("receipts", "--verify-chain", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return out.getvalue().splitlines(), err.getvalue(), exc
    return out.getvalue().splitlines(), err.getvalue(), None


def sql(statement: str, *params) -> None:
    """Change rows behind ctrlrun's back, as someone who can drop the triggers could."""
    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute(statement, params)


def last() -> ChainCheck:
    return ChainCheck.objects.order_by("-id").first()


def test_a_full_check_is_recorded(refund):
    """--verify-chain prints as before and records when, full, up to which receipt and event, intact, by whom."""
    pay(refund, 3)
    lines, _, error = check()
    assert error is None and lines[-1] == "the chain is intact"
    row = last()
    head = store.head_position()
    assert (row.mode, row.ok, row.breaks, row.from_receipt_seq, row.receipt_seq, row.event_seq) == (
        "full", True, 0, 0, 3, head[1])
    assert row.receipt_hash == Receipt.objects.get(seq=3).hash
    assert row.ran_by.startswith("receipts --verify-chain by ") and row.summary.startswith("intact: 3 of 3 receipts")
    assert store.last_check().signature_ok and abs((row.checked_at - store.now()).total_seconds()) < 60


def test_incremental_checks_only_what_was_added_and_records_it(refund):
    """After a full check of 3 receipts and 2 more calls, --incremental walks the 2 new receipts from receipt 3."""
    pay(refund, 3)
    check()
    first = last()
    pay(refund, 2, start=3)
    lines, _, error = check("--incremental")
    assert error is None, lines
    assert lines[0] == f"incremental check, after receipt seq 3 and event seq {first.event_seq}, where intact check " \
                       f"{first.id} stopped"
    assert lines[1] == "chain: 2 of 2 new receipts verified (head at seq 5)" and lines[-1] == "the chain is intact"
    row = last()
    assert (row.mode, row.ok, row.from_receipt_seq, row.receipt_seq, row.from_event_seq) == (
        "incremental", True, 3, 5, first.event_seq)
    again, _, _ = check("--incremental", "--json")
    report = json.loads(again[0])
    assert report["ok"] and report["verified"] == 0 and report["mode"] == "incremental"
    assert report["from"] == {"check": row.id, "seq": 5, "event_seq": row.event_seq}


def test_incremental_without_a_check_walks_everything(refund):
    """With no intact check recorded, --incremental checks from the genesis (and says so)."""
    pay(refund, 4)
    lines, _, error = check("--incremental")
    assert error is None and lines[0] == "incremental check, from the genesis: no intact check was recorded yet"
    assert lines[1] == "chain: 4 of 4 new receipts verified (head at seq 4)"


def test_incremental_names_a_break_in_new_receipts_and_stays_broken(refund):
    """A new receipt edited in SQL is named; the failed check is recorded, and the next one (from the last intact
    position) names it again."""
    pay(refund, 3)
    check()
    intact = last()
    pay(refund, 2, start=3)
    row = Receipt.objects.get(seq=5)
    sql('UPDATE "ctrlrun_receipt" SET "document" = %s WHERE "seq" = 5',
        row.document.replace('"amount":100', '"amount":100000'))
    lines, _, error = check("--incremental")
    assert error is not None and "break(s)" in str(error)
    assert [line.split(":")[0] for line in lines if line.startswith("  ")] == ["  content_altered at seq 5",
                                                                                "  head_mismatch at seq 5"]
    failed = last()
    assert (failed.ok, failed.breaks, failed.from_receipt_seq) == (False, 2, 3)
    assert failed.summary.startswith("broken: 2 break(s): content_altered (receipt seq 5)")
    _, _, error = check("--incremental")
    assert error is not None and last().from_receipt_seq == intact.receipt_seq


def test_incremental_names_verified_receipts_removed_or_rewritten_at_its_position(refund):
    """A receipt removed before the checked position, or the one at it rewritten, is named by --incremental."""
    pay(refund, 3)
    check()
    sql('DELETE FROM "ctrlrun_receipt" WHERE "seq" = 1')
    lines, _, error = check("--incremental")
    assert error is not None
    assert any("2 receipts lie at or before seq 3" in line for line in lines), lines
    sql('UPDATE "ctrlrun_receipt" SET "hash" = %s WHERE "seq" = 3', "sha256:" + "1" * 64)
    lines, _, error = check("--incremental")
    assert any("no longer holds the hash" in line for line in lines), lines


def test_what_incremental_does_not_cover_a_full_check_does(refund):
    """An edit in place of an old receipt (not at the checked position) is outside an incremental check (it starts
    after it); a full check names it. This is the documented limit."""
    pay(refund, 3)
    check()
    row = Receipt.objects.get(seq=2)
    sql('UPDATE "ctrlrun_receipt" SET "document" = %s WHERE "seq" = 2',
        row.document.replace('"amount":100', '"amount":100000'))
    assert check("--incremental")[2] is None
    lines, _, error = check()
    assert error is not None and any(line.startswith("  content_altered at seq 2") for line in lines)


def test_a_break_a_full_check_found_stays_until_a_full_check_is_intact(refund):
    """Tampered old receipt -> a full check finds it -> more calls -> an incremental check (which starts
    after the old intact check and never re-reads the row) must not record "intact": the front page reads
    the last check, and cron's incremental checks would otherwise wipe the break off it."""
    pay(refund, 2)
    check()
    row = Receipt.objects.get(seq=1)
    sql('UPDATE "ctrlrun_receipt" SET "document" = %s WHERE "seq" = 1',
        row.document.replace('"amount":100', '"amount":100000'))
    assert check()[2] is not None
    broken = last()
    pay(refund, 1, start=2)
    lines, _, error = check("--incremental")
    assert error is not None and not last().ok
    assert any(line.startswith(f"  unresolved") and f"chain check {broken.id}" in line for line in lines), lines
    assert check("--incremental")[2] is not None  # and again: still not cleared
    sql('UPDATE "ctrlrun_receipt" SET "document" = %s WHERE "seq" = 1', row.document)  # restored
    assert check("--incremental")[2] is not None  # an incremental check cannot tell: only a full one clears
    assert check()[2] is None and last().ok
    assert check("--incremental")[2] is None


def test_a_forged_intact_check_is_not_a_starting_point(refund):
    """A check row written around ctrlrun (no valid signature) claiming intact at the head is named, and the
    incremental check walks from the genesis instead, finding the edited receipt."""
    pay(refund, 3)
    row = Receipt.objects.get(seq=2)
    sql('UPDATE "ctrlrun_receipt" SET "document" = %s WHERE "seq" = 2',
        row.document.replace('"amount":100', '"amount":100000'))
    head = store.head_position()
    hashes = dict(Receipt.objects.values_list("seq", "hash"))
    from ctrlrun.models import Event

    ChainCheck.objects.create(checked_at=store.now(), mode="full", receipt_seq=3, receipt_hash=hashes[3],
                              event_seq=head[1], event_hash=Event.objects.get(seq=head[1]).hash, ok=True,
                              summary="intact", duration_seconds=0.1, ran_by="someone", mac="hmac-sha256:" + "0" * 64)
    lines, _, error = check("--incremental")
    assert error is not None
    assert lines[0] == "incremental check, from the genesis: no intact check was recorded yet"
    shown = [line for line in lines if line.startswith("  ")]
    assert shown[0].startswith("  signature_invalid on chain check ")
    assert any(line.startswith("  content_altered at seq 2") for line in shown)
    assert not store.last_check().ok


def test_incremental_checks_signed_rows_that_moved_since(refund, clock):
    """An effect record changed around ctrlrun after the last check (a forged signature) is named by --incremental."""
    pay(refund, 2)
    check()
    clock.advance(hours=1)
    sql('UPDATE "ctrlrun_effectrecord" SET "mac" = %s, "updated_at" = %s WHERE "effect_key" = %s',
        "hmac-sha256:" + "0" * 64, clock.now, "refund:txn_1")
    lines, _, error = check("--incremental")
    assert error is not None
    assert [line for line in lines if line.startswith("  ")][0].startswith(
        "  signature_invalid on effect refund:txn_1")


def test_incremental_checks_records_named_by_new_events_against_their_whole_story(refund, clock):
    """A record changed around ctrlrun that keeps its old time is still read when a new event names its key."""
    pay(refund, 1)
    key = "refund:txn_0"
    before = EffectRecord.objects.get(pk=key)
    check()
    clock.advance(hours=2)
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.DuplicateEffect):
        refund(payment_id="txn_0", amount=100)  # a refusal: new events naming the key
    sql('UPDATE "ctrlrun_effectrecord" SET "state" = %s WHERE "effect_key" = %s', "failed", key)
    lines, _, error = check("--incremental")
    assert error is not None and any(key in line for line in lines if line.startswith("  ")), lines
    assert before.state == "committed"


def test_progress_lines_on_long_work_and_quiet(refund, monkeypatch):
    """A long check says how far it got on stderr (every PROGRESS_EVERY rows); --quiet says nothing."""
    monkeypatch.setattr(receipts, "PROGRESS_EVERY", 2)
    monkeypatch.setattr(store.evidence, "PROGRESS_EVERY", 2)  # where the walk reads it
    pay(refund, 4)
    _, err, _ = check()
    assert "checking: read 4 receipts and" in err and "checking: 2 of 4 receipts re-hashed (" in err
    pay(refund, 4, start=4)
    _, err, _ = check("--incremental")
    assert "checking: 4 receipts re-hashed (" in err
    assert check("--quiet")[1] == ""


def test_incremental_alone_is_a_one_line_error():
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("receipts", "--incremental", stdout=out, stderr=err)
    assert str(caught.value) == ("--incremental only goes with --verify-chain (ctrlrun receipts --verify-chain "
                                 "--incremental)")


def test_console_script_runs_and_records_the_incremental_check(refund, tmp_path):
    """``python -m ctrlrun receipts --verify-chain --incremental`` (the console script) checks and records; --help
    names the option."""
    pay(refund, 2)
    env = script_environment(tmp_path, REFUND_POLICY)
    shown = subprocess.run([sys.executable, "-m", "ctrlrun", "receipts", "--help"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert "--incremental" in shown.stdout and "last intact recorded check" in " ".join(shown.stdout.split())
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "ctrlrun", "receipts", "--verify-chain", "--incremental"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.splitlines()[-1] == "the chain is intact", done.stdout + done.stderr
    assert [(c.mode, c.ok, c.receipt_seq) for c in ChainCheck.objects.order_by("id")] == [
        ("incremental", True, 2), ("incremental", True, 2)]
    assert "Traceback" not in done.stderr


def test_chain_checks_are_append_only_and_the_guard_covers_them(refund):
    """The table of checks refuses UPDATE and DELETE (and TRUNCATE on PostgreSQL) like other evidence; guard.remove
    lifts that, guard.install puts it back."""
    pay(refund, 1)
    check()
    statements = ['UPDATE "ctrlrun_chaincheck" SET "ok" = %s', 'DELETE FROM "ctrlrun_chaincheck"']
    if connection.vendor == "postgresql":
        statements.append('TRUNCATE "ctrlrun_chaincheck"')
    for statement in statements:
        with pytest.raises(DatabaseError) as refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [False] if "%s" in statement else [])
        assert "append-only" in str(refused.value)
    guard.remove(connection)
    try:
        with connection.cursor() as cursor:
            cursor.execute('UPDATE "ctrlrun_chaincheck" SET "ok" = %s', [False])
    finally:
        guard.install(connection)
    assert not ChainCheck.objects.get().ok
    assert not store.last_check().signature_ok  # changed around ctrlrun: its signature no longer verifies
