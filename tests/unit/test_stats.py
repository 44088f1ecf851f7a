"""ctrlrun.stats on receipt documents as dicts: each tally's definition, enforce and observe, the
document's keys, the ordering of tallies, unreadable rows, --since, and the text."""
from __future__ import annotations

import datetime as dt

import pytest

from ctrlrun import stats

SINCE = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)
NOW = dt.datetime(2026, 11, 30, 12, 0, 30, 123456, tzinfo=dt.timezone.utc)


def receipt(result: str, reason: str = "rule[0]", at: str = "2026-11-29T12:00:01.000Z", **extra) -> dict:
    return {"schema": "ctrlrun.receipt/v7", "result": result, "decision_reason": reason, "finished_at": at,
            "execution": None, "would_have": None, **extra}


def observed(decision: str, reason: str, blocked: str | None, execution: str = "committed",
             at: str = "2026-11-29T12:00:01.000Z") -> dict:
    return receipt("observed", reason, at, execution=execution,
                   would_have={"decision": decision, "reason": reason, "blocked_reason": blocked})


# --------------------------------------------------------------------------- enforce


def test_enforce_counts_every_receipt_denials_by_reason_and_ambiguous():
    docs = [receipt("committed"), receipt("denied", "decision"), receipt("denied", "rule[2]"),
            receipt("denied", "unknown_action"), receipt("denied", "unknown_action"), receipt("blocked"),
            receipt("ambiguous"), receipt("failed")]
    doc = stats.compute(docs, mode="enforce", since=SINCE)
    assert list(doc) == ["schema", "mode", "since", "from", "to", "actions", "denied", "denied_by_reason",
                         "ambiguous_outcomes"]
    assert doc["schema"] == "ctrlrun.stats/v1" and doc["mode"] == "enforce"
    assert doc["actions"] == 8 and doc["denied"] == 4 and doc["ambiguous_outcomes"] == 1
    # count desc, then name
    assert list(doc["denied_by_reason"].items()) == [("unknown_action", 2), ("decision", 1), ("rule[2]", 1)]


def test_enforce_reads_an_observed_receipt_as_an_action_and_its_lost_reply_as_ambiguous():
    docs = [observed("deny", "rule[2]", "rule[2]", execution="ambiguous")]
    doc = stats.compute(docs, mode="enforce", since=SINCE)
    assert (doc["actions"], doc["denied"], doc["ambiguous_outcomes"]) == (1, 0, 1)


def test_since_from_and_to():
    docs = [receipt("committed", at="2026-11-29T12:00:05.000Z"), receipt("committed", at="2026-11-29T12:00:01.500Z"),
            receipt("committed", at="2026-11-29T13:00:00.000Z")]
    doc = stats.compute(docs, mode="enforce", since=dt.datetime(2026, 11, 29, 13, 0, 0, 1999,
                                                                tzinfo=dt.timezone(dt.timedelta(hours=1))))
    assert doc["since"] == "2026-11-29T12:00:00.001Z"
    assert (doc["from"], doc["to"]) == ("2026-11-29T12:00:01.500Z", "2026-11-29T13:00:00.000Z")


def test_empty_window_has_null_from_and_to_and_zero_counts():
    doc = stats.compute([], mode="enforce", since=SINCE)
    assert doc == {"schema": "ctrlrun.stats/v1", "mode": "enforce", "since": "2026-11-29T12:00:00.000Z",
                   "from": None, "to": None, "actions": 0, "denied": 0, "denied_by_reason": {},
                   "ambiguous_outcomes": 0}


def test_unreadable_documents_are_counted_apart_and_only_when_present():
    docs = [None, "not json", {"result": "denied"}, {"finished_at": 5}, receipt("denied", "decision")]
    doc = stats.compute(docs, mode="enforce", since=SINCE)
    assert doc["unreadable_receipts"] == 4
    assert doc["actions"] == 1 and doc["denied"] == 1
    assert list(doc)[6] == "unreadable_receipts"
    assert "unreadable_receipts" not in stats.compute([receipt("committed")], mode="enforce", since=SINCE)


def test_ledger_rows_only_when_the_store_has_a_ledger():
    assert "ledger_rows" not in stats.compute([], mode="enforce", since=SINCE)
    doc = stats.compute([], mode="enforce", since=SINCE, ledger_rows=3)
    assert list(doc)[:7] == ["schema", "mode", "since", "from", "to", "actions", "ledger_rows"]
    assert doc["ledger_rows"] == 3
    assert (0, "budget ledger rows", 3) in stats.rows(doc)
    assert all(label != "budget ledger rows" for _, label, _ in stats.rows(stats.compute([], mode="enforce",
                                                                                       since=SINCE)))


def test_a_mode_must_be_known():
    with pytest.raises(ValueError, match="enforce, observe"):
        stats.compute([], mode="off", since=SINCE)


# --------------------------------------------------------------------------- observe


def test_observe_would_have_been_denied_by_reason():
    """decision deny, whatever blocked_reason says (it repeats the denial's reason): denied, not blocked."""
    docs = [observed("deny", "rule[2]", "rule[2]"), observed("deny", "unknown_action", "unknown_action"),
            observed("deny", "decision", "decision")]
    doc = stats.compute(docs, mode="observe", since=SINCE)
    assert doc["would_have_been_denied"] == 3
    assert list(doc["denied_by_reason"].items()) == [("decision", 1), ("rule[2]", 1), ("unknown_action", 1)]
    assert (doc["would_have_been_blocked"], doc["would_have_needed_approval"]) == (0, 0)


def test_observe_would_have_needed_approval():
    """decision approve stopped only by the approval gate, or with an approval that would have been used."""
    docs = [observed("approve", "rule[1]", "approval_required"), observed("approve", "rule[1]", None)]
    doc = stats.compute(docs, mode="observe", since=SINCE)
    assert doc["would_have_needed_approval"] == 2
    assert doc["would_have_been_blocked"] == 0 and doc["would_have_been_denied"] == 0


def test_observe_would_have_been_blocked_by_reason():
    """any other blocked_reason: a duplicate, a retry over an ambiguous key, an approval that did not match
    (even on an approve decision), a budget; an allowed call with none is not counted."""
    docs = [observed("allow", "rule[0]", "duplicate"), observed("allow", "rule[0]", "duplicate"),
            observed("allow", "rule[0]", "ambiguous", execution="ambiguous"),
            observed("approve", "rule[1]", "mismatch"), observed("allow", "rule[0]", None)]
    doc = stats.compute(docs, mode="observe", since=SINCE)
    assert doc["would_have_been_blocked"] == 4
    assert list(doc["blocked_by_reason"].items()) == [("duplicate", 2), ("ambiguous", 1), ("mismatch", 1)]
    assert doc["would_have_needed_approval"] == 0 and doc["would_have_been_denied"] == 0
    assert doc["actions"] == 5 and doc["ambiguous_outcomes"] == 1


def test_observe_document_keys_and_the_reference_example():
    """The reference's observed example: 3 denied, 1 approval, 2 blocked, 2 ambiguous outcomes, out of 8."""
    docs = [observed("allow", "rule[0]", None), observed("allow", "rule[0]", None, execution="ambiguous"),
            observed("deny", "rule[2]", "rule[2]"), observed("deny", "unknown_action", "unknown_action"),
            observed("deny", "decision", "decision"), observed("approve", "rule[1]", "approval_required"),
            observed("allow", "rule[0]", "duplicate"), observed("allow", "rule[0]", "ambiguous", execution="ambiguous")]
    doc = stats.compute(docs, mode="observe", since=SINCE)
    assert list(doc) == ["schema", "mode", "since", "from", "to", "actions", "would_have_been_denied",
                         "denied_by_reason", "would_have_needed_approval", "would_have_been_blocked",
                         "blocked_by_reason", "ambiguous_outcomes"]
    assert (doc["actions"], doc["would_have_been_denied"], doc["would_have_needed_approval"],
            doc["would_have_been_blocked"], doc["ambiguous_outcomes"]) == (8, 3, 1, 2, 2)
    assert doc["blocked_by_reason"] == {"ambiguous": 1, "duplicate": 1}


def test_observe_counts_an_enforce_receipt_as_an_action_only_and_its_ambiguous_result():
    docs = [receipt("denied", "decision"), receipt("ambiguous")]
    doc = stats.compute(docs, mode="observe", since=SINCE)
    assert (doc["actions"], doc["would_have_been_denied"], doc["would_have_been_blocked"],
            doc["ambiguous_outcomes"]) == (2, 0, 0, 1)


# --------------------------------------------------------------------------- --since


@pytest.mark.parametrize(("text", "back"), [("90m", dt.timedelta(minutes=90)), ("12h", dt.timedelta(hours=12)),
                                            ("7d", dt.timedelta(days=7)), (" 1m ", dt.timedelta(minutes=1))])
def test_since_spans(text, back):
    assert stats.parse_since(text, NOW) == NOW - back


def test_since_iso_times_with_an_offset_become_utc():
    assert stats.parse_since("2026-11-29T13:00:00+01:00", NOW) == SINCE
    assert stats.parse_since("2026-11-29T12:00:00Z", NOW) == SINCE
    assert stats.parse_since("2026-11-29T12:00:00.000Z", NOW).tzinfo == dt.timezone.utc


@pytest.mark.parametrize(("text", "says"), [
    ("2026-11-29T12:00:00", "no offset"), ("2026-11-29", "no offset"), ("5", "bare number"),
    ("2w", "no weeks or months"), ("3mo", "no weeks or months"), ("0h", "at least 1"), ("", "not a time"),
    ("yesterday", "not a time"), ("-2h", "not a time"), ("99999999999999999d", "before the year 1"),
    ("999999999d", "before the year 1"),
])
def test_since_refusals_say_what_is_accepted(text, says):
    with pytest.raises(ValueError, match=says) as caught:
        stats.parse_since(text, NOW)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_since_an_iso_time_that_leaves_the_calendar_in_utc_is_refused_not_a_crash(text):
    # (review 11) 00:00 on 1 January of year 1 at +01:00 is before year 1 in UTC: astimezone raised
    # OverflowError, which the command does not catch (a traceback, not a usage error).
    with pytest.raises(ValueError, match="year") as caught:
        stats.parse_since(text, NOW)
    assert "\n" not in str(caught.value)


def test_since_early_years_are_written_with_four_digits():
    # (review 11) strftime('%Y') writes year 1 as '1' on Linux: 'since' was not an ISO time.
    assert stats.iso(dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)) == "0001-01-01T00:00:00.000Z"
    early = stats.compute([], mode="enforce", since=stats.parse_since("0999-06-01T00:00:00Z", NOW))
    assert early["since"] == "0999-06-01T00:00:00.000Z"


# --------------------------------------------------------------------------- text


def test_text_enforce_rows_aligned_with_both_footnotes():
    doc = stats.compute([receipt("committed", at="2026-11-29T12:00:01.000Z"),
                         receipt("denied", "rule[2]", at="2026-11-29T12:00:02.000Z"),
                         receipt("ambiguous", at="2026-11-29T12:00:03.000Z")], mode="enforce", since=SINCE)
    text = stats.lines(doc)
    assert text[0] == "ctrlrun — 2026-11-29T12:00:01.000Z .. 2026-11-29T12:00:03.000Z   (enforce mode)"
    assert [line.split() for line in text[1:5]] == [["actions", "3"], ["denied", "1"], ["rule[2]", "1"],
                                                    ["ambiguous", "outcomes", "1"]]
    assert text[3].startswith("    rule[2]")
    assert len({len(line) for line in text[1:5]}) == 1  # the counts end in one column
    assert text[5:] == ["", stats.FOOTNOTE_ENFORCE, stats.FOOTNOTE_WAITING]


def test_text_observe_rows_and_one_footnote():
    doc = stats.compute([observed("deny", "decision", "decision"), observed("allow", "rule[0]", "duplicate")],
                        mode="observe", since=SINCE)
    text = stats.lines(doc)
    assert text[0].endswith("(observe mode)")
    labels = [line.strip().rsplit(None, 1) for line in text[1:-2]]
    assert labels == [["actions", "2"], ["would have been denied", "1"], ["decision (the entry's decision is deny)", "1"],
                      ["would have needed approval", "0"], ["would have been blocked", "1"], ["duplicate", "1"],
                      ["ambiguous outcomes", "0"]]
    assert text[-2:] == ["", stats.FOOTNOTE_WAITING]


def test_text_of_an_empty_window_names_the_boundary():
    text = stats.lines(stats.compute([], mode="enforce", since=SINCE))
    assert text[0] == "ctrlrun — no receipts since 2026-11-29T12:00:00.000Z   (enforce mode)"
    assert text[1].split() == ["actions", "0"]
