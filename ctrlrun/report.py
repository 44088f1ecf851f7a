"""Plain-text renderings of the evidence, shared by the commands (and later the console)."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from .canonical import evidence_time
from .display import reveal
from .receipts import ChainBreak, ChainReport
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
