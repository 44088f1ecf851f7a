"""Renderings of the evidence shared by the commands and the console: receipts, effects, events
and chain checks as text lines, and what a grant's budgets have spent, held and left.

A budget's numbers (authority, §C5; ``inspect --grant`` and the console's "Grants and budgets" page
read the same ones) are the ledger's (``store.budget_usage``) over its window ending at one moment,
the store's clock read once for the whole report: ``consumed`` (what the budget has used: every
charge not given back, so the calls still running or ambiguous too, as the reservation counts them),
``held`` (the part of ``consumed`` that is still running or ambiguous: it is given back if its attempt
ends failed) and ``left`` = limit - consumed (never below zero). Released charges (attempts that ended
failed) count in neither. So at the moment a call is refused ``budget_exhausted``, ``consumed`` plus
the refused call's amount is over the limit, as the refusal says.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from . import store
from .canonical import evidence_time
from .display import reveal
from .policy.authority import Grant, window_text
from .receipts import ChainBreak, ChainReport
from .states import EffectState
from .store import EffectView, EventView, ReceiptView


def receipt_line(receipt: ReceiptView) -> str:
    """One receipt, read from its hashed document (not from the index columns beside it)."""
    try:
        doc = receipt.doc
        return (
            f"{doc['finished_at']}  {reveal(doc['receipt_id'])}  {reveal(doc['action'])}  "
            f"{doc['decision']}/{doc['result']}  {reveal(doc['effect_key'] or '-')}  {reveal(doc['principal']['agent'])}"
        )
    except (ValueError, KeyError, TypeError) as exc:
        return f"seq {receipt.seq}  -  UNREADABLE  this row could not be read ({type(exc).__name__})"


def effect_line(effect: EffectView, now: dt.datetime) -> str:
    line = (
        f"{reveal(effect.effect_key)}  {effect.state}  attempt {effect.attempt}  {reveal(effect.action_id)}  "
        f"{evidence_time(effect.updated_at)}"
    )
    if effect.lease_lapsed(now):
        line += "  (lease expired)"
    if effect.resolved_by:
        line += f"  resolved by {reveal(effect.resolved_by)}"
    return line


def _where(item: ChainBreak) -> str:
    if item.kind == "event":
        return f"event seq {item.seq if item.seq is not None else '-'}"
    if item.kind == "head":
        return "the chain head"
    if item.kind == "check":
        return f"chain check {item.subject}"
    if item.kind in ("approval", "effect"):
        return f"{'approval' if item.kind == 'approval' else 'effect'} {item.subject}"
    return f"seq {item.seq if item.seq is not None else '-'}"


def chain_lines(report: ChainReport) -> list[str]:
    total = report.chained + report.unchained
    lines = [f"chain: {report.verified} of {total} receipts verified",
             f"events: {report.events_verified} of {report.events_chained + report.events_unchained} events verified"]
    if report.mode == "incremental":
        since = (f"after receipt seq {report.from_seq} and event seq {report.from_event_seq}, where intact check "
                 f"{report.from_check} stopped" if report.from_check is not None
                 else "from the genesis: no intact check was recorded yet")
        lines = [f"incremental check, {since}",
                 f"chain: {report.verified} of {total} new receipts verified (head at seq {report.head_seq})",
                 f"events: {report.events_verified} of {report.events_chained + report.events_unchained} new events "
                 f"verified (head at seq {report.event_head_seq})"]
    if report.signatures_checked is not None:
        bad = sum(1 for b in report.breaks if b.name == "signature_invalid")
        lines.append(f"signatures: {report.signatures_checked - bad} of {report.signatures_checked} signed rows "
                     f"verify (the chain head, approvals, effect records, delegations, budget charges, policy texts, "
                     f"chain checks, paused runs"
                     + (" that moved since, or that new events name)" if report.mode == "incremental" else ")"))
    if report.ok:
        lines.append("the chain is intact")
    else:
        preposition = {"approval": "on", "effect": "on", "head": "at", "check": "on", "delegation": "on",
                       "ledger": "on", "policy": "on", "paused": "on"}
        lines += [f"  {b.name} {preposition.get(b.kind, 'at')} {_where(b)}: {b.detail}" for b in report.breaks]
        lines.append(f"the chain is broken: {len(report.breaks)} break(s)")
    return lines


def _value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "null" if value is None else str(value)


def event_line(event: EventView) -> str:
    pairs = " ".join(f"{k}={_value(v)}" for k, v in event.data.items() if k != "action")
    return f"{event.id:>5}  {evidence_time(event.ts)}  {event.type:<28}{pairs}".rstrip()


# --------------------------------------------------------------------------- a grant's budgets

BUDGET_SCHEMA = "ctrlrun.budget/v1"


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
    return {"schema": BUDGET_SCHEMA, "grant_id": grant.id, "at": evidence_time(now), "budgets": budgets}


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
