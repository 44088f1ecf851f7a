"""What a grant's budgets have spent, held and left (authority, §C5): ``inspect --grant`` and the
console's "Grants and budgets" page read the same numbers from here.

A budget's numbers are the ledger's (``store.budget_usage``) over its window ending at one moment, the
store's clock read once for the whole report: ``consumed`` (what the budget has used: every charge not
given back, so the calls still running or ambiguous too, as the reservation counts them), ``held`` (the
part of ``consumed`` that is still running or ambiguous: it is given back if its attempt ends failed) and
``left`` = limit - consumed (never below zero). Released charges (attempts that ended failed) count in
neither. So at the moment a call is refused ``budget_exhausted``, ``consumed`` plus the refused call's
amount is over the limit, as the refusal says.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from . import store
from .authority import Grant, window_text
from .canonical import evidence_time
from .models import BudgetLedger, EffectRecord, Receipt
from .states import EffectState

SCHEMA = "ctrlrun.budget/v1"

#: How many calls the console lists per budget (the newest first); the rest are counted.
CALLS_SHOWN = 50


def budget_document(grant: Grant, now: dt.datetime | None = None) -> dict[str, Any]:
    """The ``ctrlrun.budget/v1`` document of one grant at ``now`` (the store's clock by default)."""
    now = now or store.now()
    budgets = []
    for budget in grant.budgets or ():
        committed, held, holding = store.budget_usage(grant.id, budget.metric, budget.window_seconds, now)
        budgets.append({
            "metric": budget.metric,
            "limit": budget.limit,
            "window_seconds": budget.window_seconds,
            "consumed": committed + held,  # what the reservation sums: holds count until they end
            "held": held,
            "holding": [{"effect_key": key, "state": state, "amount": amount, "attempt": attempt,
                         "consumed_at": evidence_time(at)} for key, state, amount, attempt, at in holding],
        })
    return {"schema": SCHEMA, "grant_id": grant.id, "at": evidence_time(now), "budgets": budgets}


def per_window(seconds: int) -> str:
    """``86400`` -> ``day``, ``3600`` -> ``hour``, ``7200`` -> ``2 hours``: the window after 'per'."""
    text = window_text(seconds)
    return text[2:] if text.startswith("1 ") and " " not in text[2:] else text


def budget_lines(document: dict[str, Any], resolve_command: str) -> list[str]:
    """The text of ``inspect --grant``: ``grant <id>``, then per budget
    ``<metric>: <consumed> of <limit> per <window>, <held> held`` (``consumed`` includes the holds) and each
    hold under it."""
    lines = [f"grant {document['grant_id']}"]
    if not document["budgets"]:
        lines.append("no budgets: this grant's calls are not capped (a grant caps spend with 'budgets:')")
        return lines
    for budget in document["budgets"]:
        lines.append(f"{budget['metric']}: {budget['consumed']} of {budget['limit']} per "
                     f"{per_window(budget['window_seconds'])}, {budget['held']} held")
        for hold in budget["holding"]:
            line = f"  {hold['amount']} held by {hold['effect_key']} ({hold['state']})"
            if hold["state"] == EffectState.AMBIGUOUS:
                line += f": once you know, '{resolve_command} {hold['effect_key']} --committed|--failed'"
            lines.append(line)
    return lines


def budget_calls(grant_id: str, metric: str, window_seconds: int, now: dt.datetime,
                 limit: int = CALLS_SHOWN) -> tuple[list[dict[str, Any]], int]:
    """The calls that spent or hold one budget in its window ending at ``now``, newest first (at most
    ``limit``), and how many there are: each ``{effect_key, attempt, amount, consumed_at, state,
    action_id, receipt_id}`` (``receipt_id`` None while the attempt has no receipt yet). Released
    charges are left out: they spend nothing."""
    alias = store.alias()
    rows = BudgetLedger.objects.using(alias).filter(
        grant_id=grant_id, metric=metric, released_at__isnull=True,
        consumed_at__gt=now - dt.timedelta(seconds=window_seconds), consumed_at__lte=now)
    total = rows.count()
    shown = list(rows.order_by("-consumed_at", "-id")[:limit])
    keys = {row.effect_key for row in shown}
    records = {key: (state, attempt, action_id) for key, state, attempt, action_id in
               EffectRecord.objects.using(alias).filter(pk__in=keys)
               .values_list("effect_key", "state", "attempt", "action_id")}
    receipts: dict[tuple[str, int], tuple[str, str]] = {}
    for receipt_id, action_id, effect_key, text in (Receipt.objects.using(alias).filter(effect_key__in=keys)
                                                    .order_by("seq")
                                                    .values_list("receipt_id", "action_id", "effect_key", "document")):
        try:
            doc = json.loads(text)
        except ValueError:  # an unreadable receipt names no attempt
            continue
        attempt = doc.get("attempt") if isinstance(doc, dict) else None
        if isinstance(attempt, int) and effect_key:
            receipts[(effect_key, attempt)] = (receipt_id, action_id)  # the last one
    calls = []
    for row in shown:
        state, attempt, action_id = records.get(row.effect_key, (None, None, None))
        if state is None:
            state = "missing"
        elif attempt != row.attempt:  # the record was renewed from failed: this attempt failed
            state, action_id = EffectState.FAILED.value, None
        receipt_id, receipt_action = receipts.get((row.effect_key, row.attempt), (None, None))
        calls.append({"effect_key": row.effect_key, "attempt": row.attempt, "amount": row.amount,
                      "consumed_at": row.consumed_at, "state": str(state),
                      "action_id": receipt_action or action_id, "receipt_id": receipt_id})
    return calls, total


__all__ = ["SCHEMA", "budget_document", "budget_lines", "budget_calls", "per_window"]
