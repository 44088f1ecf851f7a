"""Counting what the receipts say over a window: the ``ctrlrun.stats/v1`` document.

Pure: no Django, no database. ``compute`` takes receipt documents (dicts, as ``json.loads`` gives
them) and the policy's mode, and returns the document that ``stats --json`` prints, the text
command renders (``lines``) and the console's front page shows. The store streams the documents
(``store.receipt_documents_since``); nothing here holds more than the tallies.

What is counted, per receipt (one per finished or refused call; a call waiting for a human has
no receipt yet, so it is not counted):

- ``actions``: every receipt, refusals included.
- enforce mode: ``denied`` is ``result: denied``, by its ``decision_reason``;
  ``ambiguous_outcomes`` is ``result: ambiguous``.
- observe mode (``result: observed``, with ``would_have`` = ``{decision, reason, blocked_reason}``),
  each receipt in at most one of the first three, tried in this order:

  1. ``would_have_been_denied``: ``would_have.decision`` is ``deny`` (by ``would_have.reason``,
     the rule or reason that decided it: ``rule[2]``, ``decision``, ``unknown_action`` ...);
  2. ``would_have_needed_approval``: ``would_have.decision`` is ``approve`` and nothing but the
     approval gate stood in its way (``blocked_reason`` is ``approval_required``, or null: an
     approval was presented and would have been used);
  3. ``would_have_been_blocked``: any other non-null ``blocked_reason`` (``duplicate``,
     ``ambiguous``, ``in_progress``, an approval that did not match, a budget ...), by that reason.

  ``ambiguous_outcomes`` is ``execution: ambiguous`` (what really happened when it ran).

In either mode a receipt of the other kind is still one of the ``actions``, and a lost reply is
an ambiguous outcome whichever mode wrote it (``result: ambiguous``, or ``execution: ambiguous``).
A document that is not a receipt (not an object, or without a readable ``finished_at``) is counted
in ``unreadable_receipts`` and nothing else.
"""
from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .messages import denial_reason

SCHEMA = "ctrlrun.stats/v1"
MODES = ("enforce", "observe")

#: ``--since`` as a span back from now: minutes, hours or days (no weeks, months or bare numbers).
_SPAN = re.compile(r"([0-9]+)([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}
SINCE_FORMS = ("an ISO-8601 time with an offset (2026-11-29T12:00:00Z, 2026-11-29T13:00+01:00) "
               "or a span back from now: <n>m, <n>h or <n>d (30m, 12h, 7d)")

OBSERVE_BANNER = "OBSERVE MODE — nothing is enforced"


def parse_since(text: str, now: dt.datetime) -> dt.datetime:
    """The window's start for ``--since``: an aware ISO-8601 time, or ``now`` minus ``<n>m|h|d``.

    Raises ValueError with a message that says which forms are accepted."""
    value = text.strip()
    span = _SPAN.fullmatch(value)
    if span:
        if len(span.group(1)) > 12:
            raise ValueError(f"{text!r} reaches back before the year 1; give a shorter span")
        amount, unit = int(span.group(1)), span.group(2)
        if amount < 1:
            raise ValueError(f"{text!r}: a span must be at least 1 ({amount}{unit} is now)")
        try:
            return now - dt.timedelta(**{_UNITS[unit]: amount})
        except OverflowError:
            raise ValueError(f"{text!r} reaches back before the year 1; give a shorter span") from None
    if re.fullmatch(r"[0-9]+", value):
        raise ValueError(f"{text!r} is a bare number; say its unit ({value}m, {value}h or {value}d), or give "
                         f"{SINCE_FORMS}")
    if re.fullmatch(r"[0-9]+\s*[a-zA-Z]+", value):
        raise ValueError(f"{text!r} is not a span ctrlrun reads (only m, h and d: no weeks or months); "
                         f"give {SINCE_FORMS}")
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a time or a span; give {SINCE_FORMS}") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{text!r} has no offset, so it could be any time zone; add one (Z for UTC, or +01:00)")
    try:
        return moment.astimezone(dt.timezone.utc)
    except OverflowError:  # e.g. year 1 at +01:00 is before year 1 in UTC
        raise ValueError(f"{text!r} is outside the years 1 to 9999 in UTC; give a later or earlier time") from None


def iso(moment: dt.datetime) -> str:
    """UTC with milliseconds and a ``Z``: ``2026-11-29T12:00:00.000Z`` (as receipts write times)."""
    moment = moment.astimezone(dt.timezone.utc)
    # (strftime's %Y writes year 1 as '1' on glibc: the year is padded here.)
    return f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _tally(counter: Counter[str]) -> dict[str, int]:
    """A tally as the document shows it: by count, largest first, then by name."""
    return dict(sorted(counter.items(), key=lambda item: (-item[1], item[0])))


def _reason(value: Any) -> str:
    return value if isinstance(value, str) and value else "(none)"


def compute(documents: Iterable[Any], *, mode: str, since: dt.datetime,
            ledger_rows: int | None = None) -> dict[str, Any]:
    """The ``ctrlrun.stats/v1`` document for these receipt documents under ``mode``.

    ``since`` is the window's start as asked (shown, not used to filter: the caller reads only the
    receipts in the window). ``ledger_rows`` is the budget ledger's row count, or None when the
    store has no ledger (then the key is left out)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    actions = unreadable = denied = approval = blocked = ambiguous = 0
    denied_by: Counter[str] = Counter()
    blocked_by: Counter[str] = Counter()
    first: str | None = None
    last: str | None = None
    for doc in documents:
        finished = doc.get("finished_at") if isinstance(doc, Mapping) else None
        if not isinstance(finished, str) or not finished:
            unreadable += 1
            continue
        actions += 1
        first = finished if first is None or finished < first else first
        last = finished if last is None or finished > last else last
        result = doc.get("result")
        would = doc.get("would_have") if result == "observed" else None
        if result == "ambiguous" or (result == "observed" and doc.get("execution") == "ambiguous"):
            ambiguous += 1
        if mode == "enforce":
            if result == "denied":
                denied += 1
                denied_by[_reason(doc.get("decision_reason"))] += 1
            continue
        if not isinstance(would, Mapping):
            continue
        decision, blocked_reason = would.get("decision"), would.get("blocked_reason")
        if decision == "deny":
            denied += 1
            denied_by[_reason(would.get("reason"))] += 1
        elif decision == "approve" and blocked_reason in (None, "approval_required"):
            approval += 1
        elif blocked_reason is not None:
            blocked += 1
            blocked_by[_reason(blocked_reason)] += 1
    document: dict[str, Any] = {"schema": SCHEMA, "mode": mode, "since": iso(since), "from": first, "to": last,
                                "actions": actions}
    if ledger_rows is not None:
        document["ledger_rows"] = ledger_rows
    if unreadable:
        document["unreadable_receipts"] = unreadable
    if mode == "enforce":
        document.update(denied=denied, denied_by_reason=_tally(denied_by), ambiguous_outcomes=ambiguous)
    else:
        document.update(would_have_been_denied=denied, denied_by_reason=_tally(denied_by),
                        would_have_needed_approval=approval, would_have_been_blocked=blocked,
                        blocked_by_reason=_tally(blocked_by), ambiguous_outcomes=ambiguous)
    return document


FOOTNOTE_ENFORCE = "No breakdown of refused duplicates or ambiguous retries in enforce mode ('receipts' lists each)."
FOOTNOTE_WAITING = "Calls waiting for a human are not counted: their receipt comes when they run or are refused."


def rows(document: Mapping[str, Any]) -> list[tuple[int, str, Any]]:
    """The document as (indent, label, count) rows, in the order the text shows them. A budget
    ledger row appears only when the store has a ledger (``ledger_rows`` in the document)."""
    out: list[tuple[int, str, Any]] = [(0, "actions", document["actions"])]
    if document["mode"] == "enforce":
        out.append((0, "denied", document["denied"]))
        out += [(1, denial_reason(reason), count) for reason, count in document["denied_by_reason"].items()]
    else:
        out.append((0, "would have been denied", document["would_have_been_denied"]))
        out += [(1, denial_reason(reason), count) for reason, count in document["denied_by_reason"].items()]
        out.append((0, "would have needed approval", document["would_have_needed_approval"]))
        out.append((0, "would have been blocked", document["would_have_been_blocked"]))
        out += [(1, reason, count) for reason, count in document["blocked_by_reason"].items()]
    out.append((0, "ambiguous outcomes", document["ambiguous_outcomes"]))
    if "ledger_rows" in document:
        out.append((0, "budget ledger rows", document["ledger_rows"]))
    if document.get("unreadable_receipts"):
        out.append((0, "unreadable receipts", document["unreadable_receipts"]))
    return out


def lines(document: Mapping[str, Any]) -> list[str]:
    """The text ``stats`` prints: a header, aligned rows, the footnotes."""
    mode = document["mode"]
    if document["from"] is None:
        header = f"ctrlrun — no receipts since {document['since']}   ({mode} mode)"
    else:
        header = f"ctrlrun — {document['from']} .. {document['to']}   ({mode} mode)"
    table = rows(document)
    width = max(len(label) + 2 * indent for indent, label, _ in table)
    out = [header]
    out += [f"  {'  ' * indent}{label:<{width - 2 * indent}}  {count:>6}" for indent, label, count in table]
    out.append("")
    if mode == "enforce":
        out.append(FOOTNOTE_ENFORCE)
    out.append(FOOTNOTE_WAITING)
    return out
