"""Unit tests for ctrlrun.receipts: receipt documents, hashes and chain verification (§9.2–9.4).

Pure layer: no database, no Django setup. Chains are built here by hand, the way §9.3 says the
store builds them.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from ctrlrun.canonical import GENESIS_HASH, canonical_bytes, new_id, sha256_hash
from ctrlrun.receipts import (
    RECEIPT_KEYS,
    RECEIPT_SCHEMA,
    ChainReport,
    StoredReceipt,
    build_receipt,
    dump_receipt,
    receipt_hash,
    verify_chain,
)

#: §9.2, written out independently of the implementation.
SPEC_KEYS = [
    "schema", "receipt_id", "action_id", "action", "action_hash", "principal", "resource",
    "arguments", "environment", "decision", "decision_reason", "approval_id", "approver",
    "effect_key", "attempt", "result", "execution", "would_have", "error", "started_at",
    "finished_at", "seq", "prev_hash", "policy_hash", "policy_version", "controls",
    "precondition_at_request", "precondition_at_recheck", "approvers", "authority_grant_id",
    "task", "scope_hash", "budget_charges", "hop",
]
LIST_KEYS = {"controls", "approvers", "budget_charges"}


def _chain(count: int = 5) -> tuple[list[StoredReceipt], int, str]:
    """A correctly linked chain of ``count`` rows, plus the head (seq, hash)."""
    rows: list[StoredReceipt] = []
    prev = GENESIS_HASH
    for seq in range(1, count + 1):
        doc = build_receipt(
            receipt_id=new_id("ctr_"),
            action_id=new_id("act_"),
            action="stripe.refund",
            arguments={"payment_id": f"txn_{seq}", "note": "café"},
            decision="allow",
            result="committed",
            attempt=1,
            seq=seq,
            prev_hash=prev,
        )
        digest = receipt_hash(doc)
        rows.append(StoredReceipt(doc["receipt_id"], seq, prev, digest, dump_receipt(doc)))
        prev = digest
    return rows, count, prev


def _breaks(report: ChainReport) -> list[tuple[str, int | None]]:
    return [(b.name, b.seq) for b in report.breaks]


def _edit(row: StoredReceipt, **changes: object) -> StoredReceipt:
    """The row with its stored document edited (stored hash left alone)."""
    doc = json.loads(row.document)
    doc.update(changes)
    return dataclasses.replace(row, document=dump_receipt(doc))


# ---------------------------------------------------------------------------------------------
# build_receipt / receipt_hash / dump_receipt (§9.2, §9.3)
# ---------------------------------------------------------------------------------------------


def test_build_receipt_has_the_34_keys_in_spec_order() -> None:
    """A receipt has exactly the 34 §9.2 keys, in order, whatever order values are given in."""
    doc = build_receipt(hop="h", seq=3, receipt_id="ctr_x", schema="ignored")
    assert list(doc) == SPEC_KEYS
    assert len(doc) == 34
    assert list(RECEIPT_KEYS) == SPEC_KEYS


def test_build_receipt_forces_the_schema() -> None:
    """The schema is always ctrlrun.receipt/v7, even if a caller passes another."""
    assert RECEIPT_SCHEMA == "ctrlrun.receipt/v7"
    assert build_receipt()["schema"] == "ctrlrun.receipt/v7"
    assert build_receipt(schema="ctrlrun.receipt/v1")["schema"] == "ctrlrun.receipt/v7"


def test_build_receipt_defaults_lists_to_empty_and_others_to_none() -> None:
    """Unused list keys are [] and every other unused key is null."""
    doc = build_receipt()
    for key in SPEC_KEYS:
        if key == "schema":
            continue
        assert doc[key] == ([] if key in LIST_KEYS else None), key


def test_build_receipt_default_lists_are_not_shared() -> None:
    """Each receipt gets its own default lists."""
    first, second = build_receipt(), build_receipt()
    first["controls"].append("x")
    assert second["controls"] == []


def test_build_receipt_refuses_unknown_key() -> None:
    """An unknown key is a bug: TypeError naming it."""
    with pytest.raises(TypeError, match="hash"):
        build_receipt(hash="sha256:0")


def test_receipt_hash_is_independent_of_key_order() -> None:
    """The hash is over sorted canonical bytes, so key order does not matter."""
    doc = build_receipt(receipt_id="ctr_1", seq=1, prev_hash=GENESIS_HASH, result="committed")
    reversed_doc = dict(reversed(list(doc.items())))
    assert list(reversed_doc) != list(doc)
    assert receipt_hash(reversed_doc) == receipt_hash(doc)
    assert receipt_hash(doc) == sha256_hash(canonical_bytes(doc))


def test_receipt_hash_changes_with_content() -> None:
    """Any change to a value changes the hash."""
    doc = build_receipt(result="committed")
    assert receipt_hash(doc) != receipt_hash({**doc, "result": "failed"})


def test_dump_receipt_keeps_key_order_and_raw_utf8() -> None:
    """The stored JSON keeps the §9.2 key order, is compact, and keeps non-ASCII raw."""
    doc = build_receipt(action="paiement.remboursé", arguments={"z": 1, "a": "日本"})
    text = dump_receipt(doc)
    assert list(json.loads(text)) == SPEC_KEYS
    assert text.startswith('{"schema":"ctrlrun.receipt/v7","receipt_id":null,')
    assert '"arguments":{"z":1,"a":"日本"}' in text
    assert "remboursé" in text and "\\u" not in text
    assert ", " not in text and '": ' not in text


# ---------------------------------------------------------------------------------------------
# verify_chain (§9.4)
# ---------------------------------------------------------------------------------------------


def test_intact_chain_verifies() -> None:
    """A correctly built chain of five receipts is ok with all five verified."""
    rows, head_seq, head_hash = _chain(5)
    report = verify_chain(rows, head_seq, head_hash)
    assert report.ok
    assert report.breaks == []
    assert report.verified == 5 and report.chained == 5 and report.unchained == 0


def test_empty_chain_at_genesis_verifies() -> None:
    """No receipts and a head at (0, genesis) is an intact chain."""
    report = verify_chain([], 0, GENESIS_HASH)
    assert report.ok and report.verified == 0


def test_rows_out_of_order_still_verify() -> None:
    """The walk follows seq, so rows given in any order verify."""
    rows, head_seq, head_hash = _chain(5)
    shuffled = [rows[3], rows[0], rows[4], rows[2], rows[1]]
    report = verify_chain(shuffled, head_seq, head_hash)
    assert report.ok and report.verified == 5


def test_edited_content_is_content_altered_and_breaks_next_link() -> None:
    """Editing a row's document gives content_altered at that seq and link_broken at the next."""
    rows, head_seq, head_hash = _chain(5)
    rows[2] = _edit(rows[2], result="failed")
    report = verify_chain(rows, head_seq, head_hash)
    assert not report.ok
    assert _breaks(report) == [("content_altered", 3), ("link_broken", 4)]
    assert report.verified == 3
    altered = report.breaks[0].detail
    assert rows[2].hash in altered  # names the stored hash it disagrees with


def test_edit_with_rewritten_hash_still_breaks_next_link() -> None:
    """Rewriting the stored hash to match an edit is still caught by the next row's link."""
    rows, head_seq, head_hash = _chain(5)
    edited = _edit(rows[1], result="failed")
    rows[1] = dataclasses.replace(edited, hash=receipt_hash(json.loads(edited.document)))
    report = verify_chain(rows, head_seq, head_hash)
    assert _breaks(report) == [("link_broken", 3)]


def test_edit_of_last_row_is_a_head_mismatch() -> None:
    """Editing the newest row shows as content_altered and a head whose hash no longer matches."""
    rows, head_seq, head_hash = _chain(5)
    rows[4] = _edit(rows[4], error="x")
    report = verify_chain(rows, head_seq, head_hash)
    assert _breaks(report) == [("content_altered", 5), ("head_mismatch", 5)]


def test_deleted_row_is_missing_and_breaks_next_link() -> None:
    """Deleting a row gives missing at its seq and link_broken at the next."""
    rows, head_seq, head_hash = _chain(5)
    del rows[2]
    report = verify_chain(rows, head_seq, head_hash)
    assert _breaks(report) == [("missing", 3), ("link_broken", 4)]
    assert report.verified == 3 and report.chained == 4


def test_deleted_last_row_is_a_head_mismatch() -> None:
    """Deleting the newest row leaves the head pointing past the end."""
    rows, head_seq, head_hash = _chain(5)
    report = verify_chain(rows[:-1], head_seq, head_hash)
    assert _breaks(report) == [("head_mismatch", 5)]


def test_null_hash_is_hash_missing() -> None:
    """A NULL stored hash is hash_missing at that seq; the next link still verifies."""
    rows, head_seq, head_hash = _chain(5)
    rows[1] = dataclasses.replace(rows[1], hash=None)
    report = verify_chain(rows, head_seq, head_hash)
    assert _breaks(report) == [("hash_missing", 2)]
    assert report.verified == 4


def test_head_seq_mismatch() -> None:
    """A head seq that is not the last row's seq is head_mismatch."""
    rows, head_seq, head_hash = _chain(5)
    report = verify_chain(rows, head_seq + 1, head_hash)
    assert _breaks(report) == [("head_mismatch", 6)]
    assert report.verified == 5


def test_head_hash_mismatch() -> None:
    """A head hash that is not the last row's hash is head_mismatch."""
    rows, head_seq, _ = _chain(5)
    report = verify_chain(rows, head_seq, "sha256:" + "f" * 64)
    assert _breaks(report) == [("head_mismatch", 5)]


def test_rows_without_a_head_advance_are_a_head_mismatch() -> None:
    """Receipts present while the head is still at genesis is head_mismatch."""
    rows, _, _ = _chain(2)
    assert _breaks(verify_chain(rows, 0, GENESIS_HASH)) == [("head_mismatch", 0)]


def test_null_seq_row_is_unchained_and_never_ok() -> None:
    """A row with NULL seq is an unchained break, even when the chain itself is intact."""
    rows, head_seq, head_hash = _chain(5)
    doc = build_receipt(receipt_id="ctr_loose", result="committed")
    loose = StoredReceipt("ctr_loose", None, None, receipt_hash(doc), dump_receipt(doc))
    report = verify_chain([*rows, loose], head_seq, head_hash)
    assert not report.ok
    assert _breaks(report) == [("unchained", None)]
    assert "ctr_loose" in report.breaks[0].detail
    assert report.unchained == 1 and report.chained == 5 and report.verified == 5


@pytest.mark.parametrize(
    "document, exc_name",
    [
        pytest.param("{not json", "JSONDecodeError", id="not-json"),
        pytest.param("[1, 2]", "ValueError", id="not-an-object"),
        pytest.param('{"amount": 1.5}', "InvalidArgument", id="uncanonical"),
    ],
)
def test_unreadable_row_is_content_altered(document: str, exc_name: str) -> None:
    """An unreadable row is content_altered naming the exception class, never a crash."""
    rows, head_seq, head_hash = _chain(5)
    rows[2] = dataclasses.replace(rows[2], document=document)
    report = verify_chain(rows, head_seq, head_hash)
    assert _breaks(report) == [("content_altered", 3)]
    assert f"({exc_name})" in report.breaks[0].detail
    assert report.verified == 4


def test_seq_column_disagreeing_with_document_is_content_altered() -> None:
    """A row whose seq/prev_hash columns differ from its document is content_altered."""
    rows, head_seq, head_hash = _chain(3)
    doc = json.loads(rows[1].document)
    doc["prev_hash"] = "sha256:" + "1" * 64
    tampered = dump_receipt(doc)
    rows[1] = dataclasses.replace(rows[1], document=tampered, hash=receipt_hash(doc))
    report = verify_chain(rows, head_seq, head_hash)
    assert ("content_altered", 2) in _breaks(report)


def test_spec_example_breaks_are_all_named() -> None:
    """Editing 4, deleting 7 and NULLing 10's hash gives the §9.4 list and "16 of 20 verified"."""
    rows, head_seq, head_hash = _chain(21)
    by_seq = {r.seq: r for r in rows}
    by_seq[4] = _edit(by_seq[4], result="failed")
    del by_seq[7]
    by_seq[10] = dataclasses.replace(by_seq[10], hash=None)
    report = verify_chain(by_seq.values(), head_seq, head_hash)
    assert _breaks(report) == [
        ("content_altered", 4),
        ("link_broken", 5),
        ("missing", 7),
        ("link_broken", 8),
        ("hash_missing", 10),
    ]
    assert report.verified == 16 and report.chained == 20


def test_report_as_dict_shape() -> None:
    """as_dict has ok, verified, chained, unchained, head_seq, head_hash, breaks[{name,seq,detail,kind,subject}],
    then the event chain's counts and the signatures checked."""
    rows, head_seq, head_hash = _chain(5)
    rows[1] = dataclasses.replace(rows[1], hash=None)
    data = verify_chain(rows, head_seq, head_hash).as_dict()
    assert list(data) == ["ok", "verified", "chained", "unchained", "head_seq", "head_hash", "breaks", "events",
                          "signatures_checked"]
    assert data["ok"] is False
    assert (data["verified"], data["chained"], data["unchained"]) == (4, 5, 0)
    assert (data["head_seq"], data["head_hash"]) == (head_seq, head_hash)
    assert len(data["breaks"]) == 1
    assert list(data["breaks"][0]) == ["name", "seq", "detail", "kind", "subject"]
    assert data["breaks"][0]["name"] == "hash_missing" and data["breaks"][0]["seq"] == 2
    json.dumps(data)  # serialisable as the --json output


def test_intact_report_as_dict() -> None:
    """An intact chain's as_dict says ok with no breaks."""
    rows, head_seq, head_hash = _chain(5)
    data = verify_chain(rows, head_seq, head_hash).as_dict()
    assert data["ok"] is True and data["breaks"] == [] and data["verified"] == 5
