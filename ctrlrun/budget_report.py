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
from .policy.authority import Grant, window_text
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
        if budget.currency is not None:  # only when the policy says so: the reference's document has no such key
            budgets[-1]["currency"] = budget.currency
    return {"schema": SCHEMA, "grant_id": grant.id, "at": evidence_time(now), "budgets": budgets}


#: ISO 4217 currencies whose minor unit is not a hundredth: how many digits follow the point (every other
#: code has two). A budget's ``currency`` says its amounts are minor units (cents, yen, fils).
MINOR_DIGITS = {**dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI",
                                 "VND", "VUV", "XAF", "XOF", "XPF"), 0),
                **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3)}


def amount_text(amount: int, currency: str | None = None, *, grouped: bool = True) -> str:
    """An amount of a budget for people: ``500,000``; with a currency, money from its minor units
    (``EUR 5,000.00``, ``JPY 1,234``). ``grouped=False`` leaves the thousands unseparated (``500000``), as
    ``inspect --grant`` prints them (the reference's digits)."""
    if currency is None:
        return f"{amount:,}" if grouped else str(amount)
    digits = MINOR_DIGITS.get(currency, 2)
    major, minor = divmod(amount, 10 ** digits)
    text = f"{major:,}" if grouped else str(major)
    return f"{currency} {text}.{minor:0{digits}d}" if digits else f"{currency} {text}"


def limit_text(limit: int, window_seconds: int, currency: str | None = None, *, grouped: bool = True) -> str:
    """A budget's limit and its window, the one way every page and command writes them: ``500,000 per
    day``, ``EUR 5,000.00 per day``, ``20 per 2 hours``."""
    return f"{amount_text(limit, currency, grouped=grouped)} per {per_window(window_seconds)}"


def budget_cap(budget: Any) -> str:
    """``at most 500,000 per day`` of an ``authority.Budget``: what the console shows as its cap."""
    return f"at most {limit_text(budget.limit, budget.window_seconds, budget.currency)}"


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
        currency = budget.get("currency")

        def amount(value: int) -> str:
            return amount_text(value, currency, grouped=False)

        lines.append(f"{budget['metric']}: {amount(budget['consumed'])} of "
                     f"{limit_text(budget['limit'], budget['window_seconds'], currency, grouped=False)}, "
                     f"{amount(budget['held'])} held")
        for hold in budget["holding"]:
            line = f"  {amount(hold['amount'])} held by {hold['effect_key']} ({hold['state']})"
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


__all__ = ["SCHEMA", "budget_document", "budget_lines", "budget_calls", "per_window", "amount_text", "limit_text",
           "budget_cap", "MINOR_DIGITS"]
