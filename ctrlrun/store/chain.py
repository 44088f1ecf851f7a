"""Appending to the evidence: events and receipts on their two hash chains, under the signed head.

``seal`` is the one writer of evidence (it locks the head last in its phase). A running attempt's
opening events wait on its effect record (``stash``) until its outcome, or its sweep, seals them.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import connections

from .. import conf, messages, observers, signing
from ..approvers import VerifiedApprover
from ..canonical import GENESIS_HASH, Action, Principal, evidence_time, new_id
from ..errors import CTRLRunError, EvidenceTampered
from ..models import Event, Receipt, dumps_json
from ..receipts import build_receipt, dump_receipt, event_document, event_hash, event_time, receipt_hash
from ..states import Decision, EventType, Result
from ..values import Call, Charge, EventRow, EventView, Pending
from . import sql
from .base import alias, dialect, iso_text, objects, read_clock, statements, time_param
from .signatures import HEAD_DOMAIN, head_document, head_problem, trust_head

Built = tuple  # (events, receipts) a builder makes once the seal knows the time


def event_row(type_: EventType, call_or_id: Call | str | None, effect_key: str | None, data: dict[str, Any],
              when: dt.datetime, approval_id: str | None = None, *, text: str | None = None) -> EventRow:
    action_id = call_or_id.action.action_id if isinstance(call_or_id, Call) else call_or_id
    return EventRow(when, type_.value, action_id, effect_key, approval_id, data, text)


@dataclass(frozen=True)
class ReceiptSpec:
    call: Call
    result: Result
    error: str | None
    attempt: int | None
    decision_reason: str | None = None
    #: Observe mode: what enforcing would have done ({decision, reason, blocked_reason}); the receipt
    #: then says ``observed``, with ``result`` above as its ``execution``.
    would_have: dict[str, Any] | None = None
    #: The receipt's ``decision`` when it is not the policy's: ``deny`` for a call the policy let through
    #: and a budget then refused (recorded as a constraint refusal is). POLICY_EVALUATED keeps the policy's.
    decision: Decision | None = None

    @property
    def receipt_decision(self) -> str:
        return (self.decision or self.call.decision).value

    @property
    def receipt_result(self) -> str:
        """The receipt's ``result``: ``observed`` in observe mode (``result`` is then its execution)."""
        return self.result.value if self.would_have is None else Result.OBSERVED.value


def _receipt_doc(spec: ReceiptSpec, when: dt.datetime) -> dict[str, Any]:
    call, action = spec.call, spec.call.action
    return build_receipt(
        receipt_id=new_id("ctr_"),
        action_id=action.action_id,
        action=action.name,
        action_hash=action.hash,
        principal=action.principal.as_evidence(),
        resource=action.resource,
        arguments=action.arguments,
        environment=action.environment,
        decision=spec.receipt_decision,
        decision_reason=spec.decision_reason or call.reason,
        approval_id=call.approval_id,
        approver=call.approver,
        effect_key=call.effect_key,
        attempt=spec.attempt,
        result=spec.receipt_result,
        execution=None if spec.would_have is None else spec.result.value,
        would_have=spec.would_have,
        error=spec.error,
        started_at=evidence_time(call.started_at or when),
        finished_at=evidence_time(when),
        policy_hash=call.policy_hash,
        policy_version=call.policy_version,
        controls=list(call.controls),
        precondition_at_request=call.precondition_at_request,
        precondition_at_recheck=call.precondition_at_recheck,
        approvers=[approver.as_json() for approver in call.approvers],
        authority_grant_id=call.authority_grant_id,
        task=call.task,
        hop=call.hop,
        scope_hash=call.scope_hash,
        budget_charges=_receipt_charges(spec),
    )


def _receipt_charges(spec: ReceiptSpec) -> list[dict[str, Any]]:
    """The receipt's ``budget_charges``: what the call's taken key charged (one per ledger row); a
    refused call (denied, blocked) charged nothing."""
    if not spec.call.budget_charges or spec.result in (Result.DENIED, Result.BLOCKED):
        return []
    from .budgets import distinct

    return [charge.evidence() for charge in distinct(spec.call.budget_charges)]


def _take_head(cursor: Any, receipts: int, events: int, *, clock: bool = False) -> tuple:
    """Lock the head row and advance both chains; returns the row with the new seqs, old hashes
    (and, with ``clock``, the database's time: one round trip for both)."""
    statement = sql.HEAD_TAKE + (", now()" if clock else "")
    head = cursor.execute(statement, [receipts, events]).fetchone()
    if head is None:
        # Only a store whose tables were emptied (e.g. a test flush) has no head. Two first writers
        # may race here: the loser's insert does nothing (on PostgreSQL it waits for the winner), and
        # its UPDATE then takes the next seq after the winner's.
        created = cursor.execute(sql.HEAD_CREATE, [GENESIS_HASH, GENESIS_HASH]).fetchone()
        # A head this writer had to make, over evidence already there, would hide a deletion.
        if created is not None and (objects(Receipt).exists() or objects(Event).exists()):
            raise EvidenceTampered(messages.head_missing_restore())
        head = cursor.execute(statement, [receipts, events]).fetchone()
    return head


def seal(events: Sequence[EventRow], receipts: Sequence[ReceiptSpec], when: dt.datetime | None, *,
         build: Any = None, sizes: tuple[int, int] = (0, 0)) -> list[dict[str, Any]]:
    """Append ``events`` and ``receipts`` to their chains. Must run inside a phase; locks the head last.

    The head's signature is checked before anything is added on top of it: a head moved around
    ctrlrun must not be re-signed by the next honest writer. With ``when`` None (PostgreSQL, a phase
    that has not read the clock yet), the head's lock brings the database's time, and ``build(when)``
    makes the ``sizes`` = (events, receipts) it appends. On PostgreSQL the events, the receipts and the
    head's move are one statement, so the head stays locked for two round trips in all.
    """
    connection = connections[alias()]
    database = dialect(connection)
    if build is None:
        if not events and not receipts:
            return []
        sizes = (len(events), len(receipts))
    database_clock = when is None and database.CLOCK_IN_DATABASE and not conf.clock_overridden()
    if when is None and not database_clock:
        when = read_clock()
    docs = [] if build is not None else [_receipt_doc(spec, when) for spec in receipts]  # before the lock
    adapt = time_param(connection)
    with statements() as cursor:
        head = _take_head(cursor, sizes[1], sizes[0], clock=database_clock)
        seq, prev, event_seq, event_prev, mac, key_id = head[:6]
        problem = head_problem(seq - sizes[1], prev, event_seq - sizes[0], event_prev, mac, key_id)
        if problem is not None:
            raise EvidenceTampered(messages.refuses_to_add(problem))
        if build is not None:
            when = head[6] if database_clock else when
            events, receipts = build(when)
            docs = [_receipt_doc(spec, when) for spec in receipts]
            assert (len(events), len(receipts)) == sizes, "a builder made other than it announced"
        event_params: list[Any] = []
        listening = observers.wanted() is not None
        observed: list[EventView] = []
        position = event_seq - len(events)
        for event in events:
            position += 1
            ts, type_, action_id, effect_key, approval_id = (event.ts, event.type, event.action_id, event.effect_key,
                                                             event.approval_id)
            if listening:
                observed.append(EventView(None, ts, type_, action_id, effect_key, approval_id, event.data, position))
            text = event.text if event.text is not None else dumps_json(event.data)
            digest = event_hash(event_document(position, event_prev, event_time(ts), type_, action_id,
                                               effect_key, approval_id, text))
            event_params += [adapt(ts), type_, action_id, effect_key, approval_id, text, position, event_prev, digest]
            event_prev = digest
        receipt_params: list[Any] = []
        position = seq - len(docs)
        for doc, spec in zip(docs, receipts):
            position += 1
            doc["seq"], doc["prev_hash"] = position, prev
            digest = receipt_hash(doc, trusted=True)
            action = spec.call.action
            receipt_params += [doc["receipt_id"], position, action.action_id, action.name, action.principal.agent,
                               spec.receipt_decision, spec.receipt_result, spec.call.effect_key, adapt(when),
                               dump_receipt(doc), prev, digest]
            prev = digest
        head_mac = signing.sign(HEAD_DOMAIN, head_document(seq, prev, event_seq, event_prev, signing.key_id()))
        head_params = [prev, event_prev, head_mac, signing.key_id()]
        database.append_evidence(
            cursor, (sql.EVENT_INSERT + sql.value_rows(9, len(events)), event_params) if events else None,
            (sql.RECEIPT_INSERT + sql.value_rows(12, len(docs)), receipt_params) if docs else None, head_params)
    trust_head(seq, prev, event_seq, event_prev, head_mac, signing.key_id())
    if listening:
        observers.after_commit(alias(), observed, docs)  # delivered once this phase commits
    return docs


def opening_events(call: Call, when: dt.datetime, *, with_policy: bool = True) -> list[EventRow]:
    """ACTION_PROPOSED, the authority's answer (with an ``authority:`` section), POLICY_EVALUATED
    (unless ``with_policy`` is False: the call was refused before the policy was asked)."""
    action = call.action
    # The data's text is built from the action's canonical JSON, already encoded for its hash.
    proposed_text = '{"action_hash":"%s","action":%s}' % (action.hash, action.canonical_json)
    proposed = {"action_hash": action.hash, "action": action.canonical()}
    if call.origin:  # where the call came from (the MCP gateway's client, session, upstream): chained with the rest
        proposed["origin"] = dict(call.origin)
        proposed_text = proposed_text[:-1] + ',"origin":%s}' % dumps_json(proposed["origin"])
    events = [
        event_row(EventType.ACTION_PROPOSED, call, call.effect_key, proposed, call.started_at or when,
                  text=proposed_text),
    ]
    if call.authority is not None:  # authority (v3) is asked before the policy
        resolved = call.authority.get("reason") == "authority_grant"
        events.append(event_row(EventType.AUTHORITY_RESOLVED if resolved else EventType.AUTHORITY_DENIED, call,
                                call.effect_key, dict(call.authority), when))
    if with_policy:
        events.append(event_row(EventType.POLICY_EVALUATED, call, call.effect_key,
                                {"decision": call.decision.value, "reason": call.reason}, when))
    return events


def started_call(call: Call, when: dt.datetime) -> Call:
    return call if call.started_at is not None else replace(call, started_at=when)


def stash(call: Call, attempt: int, events: Sequence[EventRow]) -> Pending:
    """The running attempt's opening events as kept on its record, with what a sweeper needs to
    write the receipt of an attempt whose worker never came back. Each event's data is encoded
    once, here, and the same text is what joins the chain."""
    rows = tuple(event if event.text is not None else
                 EventRow(event.ts, event.type, event.action_id, event.effect_key, event.approval_id, event.data,
                          dumps_json(event.data)) for event in events)
    proposed = any(event.type == EventType.ACTION_PROPOSED.value for event in events)
    document = {
        "v": 1,
        # The action is in ACTION_PROPOSED's data when that event waits here too; else it is kept here.
        "call": {"action": None if proposed else call.action.canonical(), "action_id": call.action.action_id,
                 "decision": call.decision.value, "reason": call.reason, "policy_hash": call.policy_hash,
                 "approval_id": call.approval_id, "approver": call.approver,
                 "started_at": iso_text(call.started_at), "effect_key": call.effect_key, "attempt": attempt,
                 "controls": list(call.controls), "policy_version": call.policy_version,
                 **({"authority": dict(call.authority)} if call.authority else {}),
                 **({"task": call.task} if call.task else {}),
                 **({"hop": call.hop} if call.hop else {}),
                 **({"approvers": [a.as_json() for a in call.approvers]} if call.approvers else {}),
                 **({"scope_hash": call.scope_hash} if call.scope_hash else {}),
                 **({"preconditions": [call.precondition_at_request, call.precondition_at_recheck]}
                    if call.precondition_at_request or call.precondition_at_recheck else {}),
                 **({"would_have": dict(call.would_have)} if call.would_have else {}),
                 **({"budget_charges": [[c.grant_id, c.metric, c.amount, c.limit, c.window_seconds]
                                        for c in call.budget_charges]} if call.budget_charges else {}),
                 **_credential(call.action.principal)},
        "events": [[event_time(e.ts), e.type, e.action_id, e.effect_key, e.approval_id, e.text] for e in rows],
    }
    return Pending(dumps_json(document), rows)


def _credential(principal: Principal) -> dict[str, Any]:
    """What a verified principal carried beyond its hashed agent and user, kept for the sweeper's receipt."""
    if not principal.claims and principal.issuer is None and principal.expires_at is None:
        return {}
    return {"credential": {"claims": dict(principal.claims), "issuer": principal.issuer,
                           "expires_at": iso_text(principal.expires_at)}}


def _principal(hashed: dict[str, Any], credential: dict[str, Any] | None) -> Principal:
    if not credential:
        return Principal(hashed["agent"], hashed["user"])
    expires = credential.get("expires_at")
    return Principal(hashed["agent"], hashed["user"], claims=credential.get("claims") or {},
                     issuer=credential.get("issuer"), expires_at=dt.datetime.fromisoformat(expires) if expires else None)


def unstash(text: str) -> tuple[Call, int, list[EventRow]]:
    document = json.loads(text)
    info = document["call"]
    events = [EventRow(dt.datetime.fromisoformat(ts), type_, action_id, key, approval_id, json.loads(data), data)
              for ts, type_, action_id, key, approval_id, data in document["events"]]
    canonical = info["action"] or next(e.data["action"] for e in events if e.type == EventType.ACTION_PROPOSED.value)
    principal = canonical["principal"]
    action = Action(canonical["name"], canonical["arguments"], _principal(principal, info.get("credential")),
                    resource=canonical["resource"], environment=canonical["environment"],
                    action_id=info["action_id"])
    call = Call(action, Decision(info["decision"]), info["reason"], info["policy_hash"], info["effect_key"],
                dt.datetime.fromisoformat(info["started_at"]) if info["started_at"] else None,
                info["approval_id"], info["approver"], controls=tuple(info.get("controls") or ()),
                policy_version=info.get("policy_version"), would_have=info.get("would_have"),
                authority=info.get("authority"), task=info.get("task"), hop=info.get("hop"),
                scope_hash=info.get("scope_hash"),
                precondition_at_request=(info.get("preconditions") or [None, None])[0],
                precondition_at_recheck=(info.get("preconditions") or [None, None])[1],
                approvers=tuple(VerifiedApprover(a["agent"], a["user"], a["issuer"], tuple(a["entitled"]),
                                                 a["granted_at"]) for a in info.get("approvers") or ()),
                budget_charges=tuple(Charge(*charge) for charge in info.get("budget_charges") or ()))
    return call, info["attempt"], events


def call_from_events(action_id: str, effect_key: str) -> Call | None:
    """A record written before opening events were kept on it: rebuild its call from its events."""
    found = {e.type: e.data for e in objects(Event).filter(action_id=action_id, type__in=[
        EventType.ACTION_PROPOSED, EventType.POLICY_EVALUATED]).order_by("-id")}
    proposed, evaluated = found.get(EventType.ACTION_PROPOSED.value), found.get(EventType.POLICY_EVALUATED.value)
    if not proposed or not evaluated or not isinstance(proposed.get("action"), dict):
        return None
    canonical = proposed["action"]
    try:
        principal = canonical["principal"]
        action = Action(canonical["name"], canonical["arguments"], Principal(principal["agent"], principal["user"]),
                        resource=canonical["resource"], environment=canonical["environment"], action_id=action_id)
        return Call(action, Decision(evaluated["decision"]), evaluated["reason"], None, effect_key)
    except (CTRLRunError, KeyError, TypeError, ValueError):
        return None
