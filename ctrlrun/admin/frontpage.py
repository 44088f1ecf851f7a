"""The console's front page: what needs a person now, read in a few indexed queries.

The front page never re-hashes evidence: the receipt chain's tile shows the last *recorded* check
(``receipts --verify-chain [--incremental]``, or the button on the chain page), its age and how
much evidence was written since. It warns when that check is older than
``CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS`` (or there is none) and alerts when it failed, or when its
record does not carry ctrlrun's signature.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone
from django.utils.timesince import timesince

from .. import conf, stats, store
from ..display import reveal
from ..errors import CTRLRunError

#: The front page's window of receipts: bounded, so the table costs one indexed range read.
STATS_WINDOW = dt.timedelta(hours=24)
#: At most this many of the window's most recent receipts are counted on each page load (a busy
#: store writes far more a day; ``manage.py stats`` counts them all). The caption says when it cut.
STATS_LIMIT = 10_000


def _age(then: dt.datetime, now: dt.datetime) -> str:
    if now - then < dt.timedelta(minutes=1):
        return "just now"
    return f"{timesince(then, now, depth=1)} ago"


def chain_status(check: store.ChainCheckView | None, head_seq: int, now: dt.datetime,
                 max_age: dt.timedelta) -> dict[str, Any]:
    """The chain tile: ``status`` (its big word), ``level`` ("" ok, ``attention``, ``alert``) and ``label``."""
    if check is None:
        written = f"{head_seq:,} receipt{'s' if head_seq != 1 else ''}"
        return {"status": "unchecked", "level": "attention",
                "label": f"receipt chain never checked ({written}): run receipts --verify-chain"}
    if not check.signature_ok:
        return {"status": "untrusted", "level": "alert",
                "label": f"the last chain check on record (#{check.id}) does not carry ctrlrun's signature: it was "
                         f"written outside ctrlrun. Run a full check"}
    since = max(head_seq - check.receipt_seq, 0)
    label = (f"receipt chain {'intact' if check.ok else 'broken'}, checked {_age(check.checked_at, now)} "
             f"({check.mode}, up to receipt {check.receipt_seq:,})")
    if not check.ok:
        label += f": {check.breaks} break{'s' if check.breaks != 1 else ''}"
    label += f"; {since:,} receipt{'s' if since != 1 else ''} written since"
    stale = now - check.checked_at > max_age
    if stale:
        label += f"; older than {timesince(now - max_age, now, depth=1)}: run receipts --verify-chain --incremental"
    return {"status": "intact" if check.ok else "broken", "level": "alert" if not check.ok else (
        "attention" if stale else ""), "label": label, "stale": stale, "check": check}


def recent_stats(now: dt.datetime) -> dict[str, Any]:
    """The last 24 hours as ``stats`` counts them (``ctrlrun.stats``, the same function), for a small
    table: ``document``, its ``rows`` (indent, label, count; reasons with hidden characters shown),
    and ``problem`` when the policy did not load (then the counts are enforce mode's)."""
    from ..control import default_control

    problem = None
    try:
        mode = default_control().read_policy().mode  # read only: nothing is stored
    except CTRLRunError as exc:
        mode, problem = "enforce", f"the policy did not load ({exc}), so these are enforce mode's counts"
    document = stats.compute(store.receipt_documents_since(now - STATS_WINDOW, limit=STATS_LIMIT), mode=mode,
                             since=now - STATS_WINDOW)
    rows = [{"indent": indent, "label": reveal(str(label)), "count": count}
            for indent, label, count in stats.rows(document)]
    counted = document["actions"] + document.get("unreadable_receipts", 0)
    return {"document": document, "rows": rows, "problem": problem, "observing": mode == "observe",
            "cut": STATS_LIMIT if counted >= STATS_LIMIT else None}


def overview_context() -> dict[str, Any]:
    """The front page's counts, the last 24 hours' stats and the last chain check: a few indexed reads
    (the stats one bounded to the window), whatever the store's size."""
    counts = store.overview()
    now = store.now()
    recent = recent_stats(now)
    try:
        max_age = conf.chain_check_max_age()
    except CTRLRunError as exc:  # a bad setting: said on the tile (and by manage.py check), not a 500
        return {"overview": counts, "chain": {"status": "unknown", "level": "alert", "label": str(exc)},
                "chain_status": "unknown", "now": timezone.now(), "stats": recent}
    chain = chain_status(store.last_check(), counts.receipts, now, max_age)
    return {"overview": counts, "chain": chain, "chain_status": chain["status"], "now": timezone.now(),
            "stats": recent}
