"""The receipt hash chain on a real database (§9.3, §9.4): every receipt links to the one before
it, ``receipts --verify-chain`` names each kind of tampering done with raw SQL behind ctrlrun's
back, and two OS processes writing at once still leave one linear chain."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

import ctrlrun
from ctrlrun import store
from ctrlrun.models import EffectRecord, Receipt
from tests.support import REFUND_POLICY
from tests.support import evidence_unguarded, script_environment

pytestmark = pytest.mark.usefixtures("store_db")

GENESIS = "sha256:" + "0" * 64
TABLE = Receipt._meta.db_table


def rows() -> list[Receipt]:
    return list(Receipt.objects.order_by("seq"))


def recompute(document: str) -> str:
    """The chain hash, computed here from §9.3 rather than by ctrlrun's own code."""
    doc = json.loads(document)
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def sql(statement: str, *params) -> None:
    """Tamper with the receipts table directly, as someone with database access could."""
    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute(statement.replace("{table}", connection.ops.quote_name(TABLE)), params)


def verify(*args: str) -> tuple[list[str], CommandError | None]:
    out = StringIO()
    try:
        call_command("receipts", "--verify-chain", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return out.getvalue().splitlines(), exc
    return out.getvalue().splitlines(), None


def verify_json() -> tuple[dict, CommandError | None]:
    lines, error = verify("--json")
    [line] = lines
    return json.loads(line), error


def breaks(report: dict) -> list[tuple[str, int | None]]:
    return [(b["name"], b["seq"]) for b in report["breaks"]]


def problems(lines: list[str]) -> list[str]:
    """The break lines of --verify-chain's text output (indented, between the counts and the verdict)."""
    return [line for line in lines if line.startswith("  ")]


def intact_lines(receipts: int) -> list[str]:
    """What --verify-chain prints for an untouched store holding ``receipts`` receipts."""
    from ctrlrun.models import Approval, BudgetLedger, ChainCheck, Delegation, Event, PausedRun, PolicyDocument

    events = Event.objects.count()
    # The head, and every signed row but the check that printed these lines (recorded after it ran).
    signed = 1 + sum(model.objects.count() for model in (Approval, EffectRecord, Delegation, BudgetLedger,
                                                          PolicyDocument, ChainCheck, PausedRun)) - 1
    return [f"chain: {receipts} of {receipts} receipts verified", f"events: {events} of {events} events verified",
            f"signatures: {signed} of {signed} signed rows verify (the chain head, approvals, effect records, "
            f"delegations, budget charges, policy texts, chain checks, paused runs)",
            "the chain is intact"]


@pytest.fixture
def mixed(agent, clock):
    """Eight receipts from a mix of calls: committed, denied, ambiguous, failed, blocked and unkeyed."""
    fail: list[BaseException] = []

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id: str, amount: int) -> str:
        if fail:
            raise fail.pop()
        return f"re_{payment_id}"

    @ctrlrun.protect("audit.note")
    def note(text: str) -> None: ...

    refund(payment_id="txn_1", amount=100)                      # 1 committed
    with pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_2", amount=10**9)                # 2 denied
    fail.append(TimeoutError("read timed out"))
    with pytest.raises(TimeoutError):
        refund(payment_id="txn_3", amount=300)                  # 3 ambiguous
    fail.append(ctrlrun.NotExecuted("connection refused"))
    with pytest.raises(ctrlrun.NotExecuted):
        refund(payment_id="txn_4", amount=400)                  # 4 failed
    with pytest.raises(ctrlrun.DuplicateEffect):
        refund(payment_id="txn_1", amount=100)                  # 5 blocked
    with pytest.raises(ctrlrun.AmbiguousEffect):
        refund(payment_id="txn_3", amount=300)                  # 6 blocked
    refund(payment_id="txn_4", amount=400)                      # 7 committed, attempt 2
    note(text="done ✓")                                         # 8 committed, no key
    assert Receipt.objects.count() == 8


# --------------------------------------------------------------------------- an intact chain


def test_chain_links_every_receipt_to_the_one_before(mixed):
    """Each receipt's seq follows the last, its prev_hash is the previous hash, its hash covers its document."""
    stored = rows()
    assert [r.seq for r in stored] == list(range(1, 9))
    assert [json.loads(r.document)["result"] for r in stored] == [
        "committed", "denied", "ambiguous", "failed", "blocked", "blocked", "committed", "committed"]
    previous = GENESIS
    for row in stored:
        doc = json.loads(row.document)
        assert (row.prev_hash, doc["prev_hash"], doc["seq"]) == (previous, previous, row.seq)
        assert row.hash == recompute(row.document)
        previous = row.hash


def test_verify_chain_intact(mixed):
    """--verify-chain on an untouched store verifies every receipt and says the chain is intact."""
    lines, error = verify()
    assert error is None
    assert lines == intact_lines(8)


def test_verify_chain_json_intact(mixed):
    """--verify-chain --json prints one document: ok, counts, the heads, no breaks, the signatures checked."""
    from ctrlrun.models import Event

    report, error = verify_json()
    assert error is None
    assert list(report) == ["ok", "verified", "chained", "unchained", "head_seq", "head_hash", "breaks", "events",
                            "signatures_checked"]
    last, events = rows()[-1], Event.objects.order_by("seq")
    assert report == {"ok": True, "verified": 8, "chained": 8, "unchained": 0, "head_seq": 8,
                      "head_hash": last.hash, "breaks": [],
                      "events": {"verified": events.count(), "chained": events.count(), "unchained": 0,
                                 "head_seq": events.count(), "head_hash": events.last().hash},
                      "signatures_checked": 1 + EffectRecord.objects.count() + 1}  # and the policy text


def test_verify_chain_on_an_empty_store():
    """With no receipts the chain is trivially intact."""
    lines, error = verify()
    assert error is None
    assert lines == intact_lines(0)


# --------------------------------------------------------------------------- tampering


def edit_document(seq: int, **changes) -> tuple[str, str]:
    """Rewrite receipt ``seq``'s stored document; return (its stored hash, the edited text's hash)."""
    row = Receipt.objects.get(seq=seq)
    doc = json.loads(row.document)
    doc.update(changes)
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    sql("UPDATE {table} SET document = %s WHERE seq = %s", text, seq)
    return row.hash, recompute(text)


def test_edited_document_is_content_altered_and_breaks_the_next_link(mixed):
    """Editing one receipt's document shows content_altered at its seq and link_broken at the next; exit 1."""
    stored, edited = edit_document(3, error=None, result="committed")
    lines, error = verify()
    assert error is not None and error.returncode == 1
    assert lines[0] == "chain: 6 of 8 receipts verified"
    found = problems(lines)
    assert found[0] == f"  content_altered at seq 3: the recomputed hash {edited} is not the stored {stored}"
    # the result column (what lists and filters show) no longer agrees with the edited document
    assert found[1] == ("  content_altered at seq 3: the row's result column says 'ambiguous', but its hashed "
                        "document says 'committed'")
    assert found[2] == (f"  link_broken at seq 4: prev_hash is {stored}, and the receipt before it hashes to "
                        f"{edited}")
    assert lines[-1] == "the chain is broken: 3 break(s)"


def test_edit_with_a_rewritten_hash_is_still_caught(mixed):
    """A forger who also rewrites the edited row's hash still breaks the link from the next receipt."""
    _, edited = edit_document(3, result="committed")
    sql("UPDATE {table} SET hash = %s WHERE seq = 3", edited)
    report, error = verify_json()
    assert error is not None
    assert breaks(report) == [("content_altered", 3), ("link_broken", 4)]  # its result column still disagrees


def test_deleted_receipt_is_missing(mixed):
    """Deleting a receipt shows missing at its seq, and the next receipt's link no longer holds."""
    sql("DELETE FROM {table} WHERE seq = 5")
    lines, error = verify()
    assert error is not None
    assert lines[0] == "chain: 6 of 7 receipts verified"
    assert problems(lines)[0].startswith("  missing at seq 5: seq 5 is not here; the next receipt says it is seq 6")
    assert problems(lines)[1].startswith("  link_broken at seq 6: ")


def test_deleted_last_receipt_is_a_head_mismatch(mixed):
    """Deleting the newest receipt is caught by the chain head, which still remembers it."""
    sql("DELETE FROM {table} WHERE seq = 8")
    report, error = verify_json()
    assert error is not None
    assert breaks(report) == [("head_mismatch", 8)]
    assert (report["verified"], report["chained"]) == (7, 7)


def test_nulled_hash_is_hash_missing(mixed):
    """A receipt whose stored hash is set NULL is named hash_missing; its neighbours still verify."""
    sql("UPDATE {table} SET hash = NULL WHERE seq = 2")
    lines, error = verify()
    assert error is not None
    assert lines[0] == "chain: 7 of 8 receipts verified"
    [only] = problems(lines)
    assert only.startswith("  hash_missing at seq 2: ")


def test_nulled_seq_is_unchained(mixed):
    """A receipt whose seq is set NULL is unchained (never a pass), and its place in the walk is missing."""
    receipt_id = Receipt.objects.get(seq=4).receipt_id
    sql("UPDATE {table} SET seq = NULL WHERE seq = 4")
    report, error = verify_json()
    assert error is not None
    assert ("unchained", None) in breaks(report)
    assert ("missing", 4) in breaks(report)
    assert (report["chained"], report["unchained"]) == (7, 1)
    [unchained] = [b for b in report["breaks"] if b["name"] == "unchained"]
    assert receipt_id in unchained["detail"]
    lines, _ = verify()
    assert lines[0] == f"chain: {report['verified']} of 8 receipts verified"
    assert any(line.startswith("  unchained at seq -: ") for line in lines)


def test_corrupt_json_is_reported_without_a_traceback(mixed):
    """A receipt whose document is not JSON is a named break and an UNREADABLE line, never a crash."""
    sql("UPDATE {table} SET document = %s WHERE seq = 3", '{"schema": "ctrlrun.receipt/v7", "receipt_id": ')
    lines, error = verify()
    assert isinstance(error, CommandError) and error.returncode == 1
    assert lines[0] == "chain: 7 of 8 receipts verified"
    assert problems(lines)[0] == "  content_altered at seq 3: this row could not be read (JSONDecodeError)"
    listing = StringIO()
    call_command("receipts", stdout=listing)
    listed = listing.getvalue().splitlines()
    assert listed[2] == "seq 3  -  UNREADABLE  this row could not be read (JSONDecodeError)"
    assert len(listed) == 8 and "UNREADABLE" not in listed[3]


def test_json_that_is_not_an_object_is_reported(mixed):
    """A document that parses but is not a JSON object is reported too."""
    sql("UPDATE {table} SET document = %s WHERE seq = 6", "[1, 2, 3]")
    report, error = verify_json()
    assert error is not None
    assert breaks(report) == [("content_altered", 6)]


def test_verify_chain_json_when_broken(mixed):
    """--verify-chain --json on a broken chain lists each break as {name, seq, detail} and exits 1."""
    sql("UPDATE {table} SET hash = NULL WHERE seq = 7")
    report, error = verify_json()
    assert error is not None and error.returncode == 1
    assert report["ok"] is False
    assert report["breaks"] == [{"name": "hash_missing", "seq": 7, "detail": report["breaks"][0]["detail"],
                                 "kind": "receipt", "subject": None}]
    assert list(report["breaks"][0]) == ["name", "seq", "detail", "kind", "subject"]
    assert report["verified"] == 7


def test_inspect_of_a_corrupt_receipt_is_not_a_traceback(mixed):
    """inspect of an action whose receipt was corrupted still shows its events, and names the bad receipt."""
    row = Receipt.objects.get(seq=1)
    sql("UPDATE {table} SET document = %s WHERE seq = 1", "not json")
    out = StringIO()
    call_command("inspect", row.action_id, stdout=out)
    text = out.getvalue()
    assert f"{row.receipt_id}  UNREADABLE" in text
    assert "EXECUTION_COMMITTED" in text
    out = StringIO()
    call_command("inspect", row.action_id, "--json", stdout=out)
    document = json.loads(out.getvalue())
    assert (document["receipts"], document["unreadable_receipts"]) == ([], [row.receipt_id])
    assert document["name"] == "stripe.refund"  # still known from the ACTION_PROPOSED event


def test_edited_index_column_is_caught(refund, agent):
    """Editing only a receipt's result column (what lists show) is named, though the document is intact."""
    refund(payment_id="txn_1", amount=100)
    refund(payment_id="txn_2", amount=100)
    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute('UPDATE "ctrlrun_receipt" SET "result" = %s WHERE "seq" = 1', ["failed"])
    report = store.verify()
    assert not report.ok
    assert [(b.name, b.seq) for b in report.breaks] == [("content_altered", 1)]
    assert "result column says 'failed'" in report.breaks[0].detail


# --------------------------------------------------------------------------- concurrent writers


WORKER = """\
import json, os, pathlib, sys, time
import ctrlrun

@ctrlrun.protect("email.send", effect="email:{msg_id}")
def send(msg_id: str) -> None:
    pass

@ctrlrun.protect("audit.note")
def note(text: str) -> None:
    pass

name = os.environ["WORKER"]
folder = pathlib.Path(os.environ["SYNC_DIR"])
with ctrlrun.context(agent=name):
    note(text=f"{name} is ready")                 # opens the store before the race starts
    (folder / f"{name}.ready").touch()
    deadline = time.monotonic() + 60
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.005)
    outcomes = []
    for i in range(25):
        send(msg_id=f"{name}-{i}")               # keys of its own
        try:
            send(msg_id=f"shared-{i}")           # keys both processes race for
            outcomes.append("ran")
        except ctrlrun.DuplicateEffect as exc:
            outcomes.append(f"refused:{exc.state}")
print(json.dumps(outcomes))
"""


def test_two_processes_writing_at_once_keep_one_linear_chain(mixed, tmp_path):
    """Two OS processes making 50 calls each at once leave seq 1..N without gaps and a chain that verifies."""
    env = script_environment(tmp_path, REFUND_POLICY)
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER))
    workers = {}
    for name in ("w1", "w2"):
        workers[name] = subprocess.Popen(
            [sys.executable, str(tmp_path / "worker.py")], cwd=tmp_path, env={**env, "WORKER": name,
                                                                              "SYNC_DIR": str(tmp_path)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"{name}.ready").exists() for name in workers):
            assert all(p.poll() is None for p in workers.values()), "a worker died before the race"
            assert time.monotonic() < deadline, "the workers never got ready"
            time.sleep(0.01)
        (tmp_path / "go").touch()
        results = {name: p.communicate(timeout=180) for name, p in workers.items()}
    finally:
        for p in workers.values():
            if p.poll() is None:
                p.kill()
    for name, (out, err) in results.items():
        assert workers[name].returncode == 0, err
    outcomes = {name: json.loads(out) for name, (out, _) in results.items()}

    stored = rows()
    total = 8 + 2 * (1 + 25 + 25)
    assert [r.seq for r in stored] == list(range(1, total + 1))
    previous = GENESIS
    for row in stored:
        assert row.prev_hash == previous and row.hash == recompute(row.document)
        previous = row.hash
    lines, error = verify()
    assert error is None
    assert lines == intact_lines(total)

    # every shared key ran exactly once; the loser of each race got a blocked receipt
    for i in range(25):
        assert [outcomes["w1"][i], outcomes["w2"][i]].count("ran") == 1
        assert EffectRecord.objects.get(pk=f"email:shared-{i}").state == "committed"
    shared = [json.loads(r.document)["result"] for r in stored if (r.effect_key or "").startswith("email:shared-")]
    assert sorted(shared) == ["blocked"] * 25 + ["committed"] * 25


def test_verification_while_receipts_are_written_reports_no_false_break(refund, agent):
    """Writers appending receipts during a check never make it report a broken head."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with ctrlrun.context(agent=f"writer-{n}"):
                i = 0
                while not stop.is_set() and i < 60:
                    refund(payment_id=f"w{n}-{i}", amount=1)
                    i += 1
        except BaseException as exc:  # surfaced below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    reports = []
    try:
        for _ in range(15):
            reports.append(store.verify())
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == []
    assert [r.breaks for r in reports if not r.ok] == []
    assert store.verify().ok
