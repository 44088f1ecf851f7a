"""Approval requests: asked, answered by a person, expired, checked and used up by the call they name.

A request is bound to the action's hash; only a pending, unexpired request ctrlrun itself wrote
can be answered, and only a granted one for exactly this call is used (in the reservation's
transaction, so a refused reservation leaves it granted). An attempt that provably did nothing
(its record moved to ``failed`` by ``NotExecuted`` or a hook's ``not_executed``) gives the approval
it used back (``give_back``), in the transaction that moves the record.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import replace
from typing import Any

from django.db.models import Q

from .. import approvers as verified, messages
from ..canonical import evidence_text, evidence_time, new_id
from ..errors import ActionDenied, ApprovalMismatch, CTRLRunError, IllegalTransition, InvalidArgument, StateConflict
from ..identity import same_person
from ..models import Approval
from ..states import ApprovalStatus, Decision, EventType, Result, approval_lapsed, can_move_approval
from ..values import ApprovalView, Call, EventRow, Refused
from .base import alias, objects, reading, write_phase
from .chain import event_row, opening_events, ReceiptSpec, seal, started_call
from .signatures import approval_ok, sign_approval

logger = logging.getLogger("ctrlrun.store")
PENDING = ApprovalStatus.PENDING.value

_JSON_FIELDS = ("required_roles", "approvers")
_APPROVAL_FIELDS = [f for f in ApprovalView.__dataclass_fields__ if f not in ("signature_ok", *_JSON_FIELDS)]


def _approval_view(row: Approval) -> ApprovalView:
    genuine = approval_ok(row)
    roles, approvers = _pinned(row) if genuine else ((), ())
    return ApprovalView(**{f: getattr(row, f) for f in _APPROVAL_FIELDS}, required_roles=roles, approvers=approvers,
                        signature_ok=genuine)


def _pinned(row: Approval) -> tuple[tuple[Any, ...], tuple[verified.VerifiedApprover, ...]]:
    """A signed row's roles and verified approvers (read only once its signature held)."""
    return verified.load_roles(row.required_roles), verified.load_approvers(row.approvers)


def request_approval(call: Call, ttl: dt.timedelta) -> ApprovalView:
    """An ``approve`` decision with nothing presented: a pending request bound to the action hash."""
    with write_phase() as when:
        call = started_call(call, when)
        action = call.action
        row = Approval(
            approval_id=new_id("apr_"), status=ApprovalStatus.PENDING, action=action.name,
            action_id=action.action_id, action_hash=action.hash,
            action_json=json.dumps(action.canonical(), ensure_ascii=False, sort_keys=True),
            agent=action.principal.agent, user=action.principal.user, effect_key=call.effect_key,
            policy_hash=call.policy_hash, decision_reason=call.reason, created_at=when, expires_at=when + ttl,
            required_roles=verified.dump_roles(tuple(call.required_roles)),
            approvals_required=call.approvals_required,
            precondition_fingerprint=call.precondition_at_request,
        )
        sign_approval(row)
        row.save(using=alias(), force_insert=True)
        events = opening_events(call, when)
        events.append(event_row(EventType.APPROVAL_REQUESTED, call, call.effect_key,
                                {"action_hash": action.hash, "expires_at": evidence_time(row.expires_at)}, when,
                                row.approval_id))
        seal(events, [], when)
    return _approval_view(row)


def _save_approval(row: Approval, fields: list[str]) -> None:
    sign_approval(row)
    row.save(update_fields=[*fields, "mac"])


def _move_approval(row: Approval, target: ApprovalStatus, **changes: Any) -> None:
    """THE status write: move ``row`` to ``target`` after checking the edge is in the approval table
    (``states.APPROVAL_TRANSITIONS``), with the columns in ``changes``; signed and saved."""
    source = ApprovalStatus(row.status)
    if not can_move_approval(source, target):
        raise IllegalTransition(source.value, target.value, what="approval")
    row.status = target
    for name, value in changes.items():
        setattr(row, name, value)
    _save_approval(row, ["status", *changes])


def _expire(row: Approval, when: dt.datetime, events: list[EventRow], call: Call | None = None) -> None:
    """Mark ``row`` expired; the event belongs to ``call`` when a call presenting it found it lapsed."""
    _move_approval(row, ApprovalStatus.EXPIRED)
    owner, key = (call, call.effect_key) if call is not None else (row.action_id, row.effect_key)
    events.append(event_row(EventType.APPROVAL_EXPIRED, owner, key, {}, when, row.approval_id))


def answer_approval(approval_id: str, grant: bool, *, by: str, note: str | None = None,
                    person: Any = None) -> ApprovalView:
    """A human grants or denies a pending request. Used by the commands and the console alike.

    Only a pending, unexpired request that ctrlrun itself wrote can be answered; an expired one is
    marked expired (that write is kept) and refused. The person the call was made for (the
    principal's ``user``, compared as normalised identities) cannot answer it.

    ``person``: the authenticated Django user a verifying surface (the console) saw answer. Their
    grant is recorded as a verified approver, after checking they hold every role the request pins
    now (``store.people.holds``); the request is granted once its count of distinct people is
    reached and stays pending until then (the view's ``tally`` says ``"k of N approvals"``). Without
    ``person`` (a command, a webhook) the answer verifies nobody: it grants a request that pins no
    role and needs one approval, as always; under a count above 1 it changes nothing.
    """
    if not isinstance(by, str) or not by.strip():
        raise InvalidArgument(messages.ANSWER_NEEDS_NAME)
    by = evidence_text(by.strip())
    note = evidence_text(note) if note else None
    expired: ApprovalView | None = None
    with write_phase() as when:
        row = objects(Approval).select_for_update().filter(pk=approval_id).first()
        if row is None:
            raise StateConflict("approval", approval_id, PENDING, "missing")
        if not approval_ok(row):
            raise StateConflict("approval", approval_id, PENDING, "tampered")
        if row.status != ApprovalStatus.PENDING:
            raise StateConflict("approval", approval_id, PENDING, str(row.status), approver=row.approver)
        if approval_lapsed(row.status, row.expires_at, when):
            events: list[EventRow] = []
            _expire(row, when, events)
            seal(events, [], when)
            expired = _approval_view(row)
        else:
            if row.user is not None and same_person(row.user, by):
                raise InvalidArgument(messages.own_request(row.action, row.user, by))
            roles, approvers = _pinned(row)
            if grant and person is not None:
                approvers = _verified_grant(row, roles, approvers, person, when)
                if len(verified.distinct(approvers)) < row.approvals_required:
                    row.approvers = verified.dump_approvers(approvers)
                    _save_approval(row, ["approvers"])  # short of the count: it stays pending
                    return _approval_view(row)
            elif grant and row.approvals_required > 1:
                return _approval_view(row)  # an unverified answer counts toward no threshold
            _move_approval(row, ApprovalStatus.GRANTED if grant else ApprovalStatus.DENIED, approver=by,
                           note=note, answered_at=when, approvers=verified.dump_approvers(approvers))
            data: dict[str, Any] = {"approver": by}
            if grant:
                data["action_hash"] = row.action_hash
                if approvers and verified.needs_verification(roles, row.approvals_required):
                    data["approvers"] = [a.as_json() for a in verified.distinct(approvers)]
            if note:
                data["note"] = note
            if isinstance(person, verified.ClaimedPerson):
                data["via"] = person.via
            kind = EventType.APPROVAL_GRANTED if grant else EventType.APPROVAL_DENIED
            seal([event_row(kind, row.action_id, row.effect_key, data, when, row.approval_id)], [], when)
    if expired is not None:
        raise StateConflict("approval", approval_id, PENDING, "expired", expires_at=expired.expires_at,
                            just_expired=True)
    return _approval_view(row)


def _verified_grant(row: Approval, roles: tuple[Any, ...], approvers: tuple[verified.VerifiedApprover, ...],
                    person: Any, when: dt.datetime) -> tuple[verified.VerifiedApprover, ...]:
    """``person``'s grant added to ``approvers`` (the same person again replaces their entry), after
    checking, now, that they hold every pinned role and are not the requester."""
    from .people import holds

    claimed = isinstance(person, verified.ClaimedPerson)
    if claimed:
        username, agent, issuer = person.user, person.agent, person.issuer
    else:
        username = person.get_username() if callable(getattr(person, "get_username", None)) else None
        agent, issuer = verified.CONSOLE_AGENT, verified.CONSOLE_ISSUER
        if not getattr(person, "is_authenticated", False):
            username = None
    if not isinstance(username, str) or not username.strip():
        raise InvalidArgument("a verified answer needs an authenticated person (sign in to the console)")
    if row.user is not None and same_person(row.user, username):
        raise InvalidArgument(messages.own_request(row.action, row.user, username))
    for role in roles:
        if not (role.role in person.roles if claimed else holds(person, role.role)):
            raise InvalidArgument(f"{username} does not hold the role {role.role!r} that control {role.control!r} "
                                  f"requires of every approver of this request; a person who holds it must answer")
    entry = verified.VerifiedApprover(evidence_text(agent), evidence_text(username), evidence_text(issuer),
                                      tuple(r.control for r in roles), evidence_time(when))
    return verified.distinct((*approvers, entry))


def expire_if_due(approval_id: str) -> ApprovalView | None:
    """Mark a pending or granted request expired if its time is up (``wait=True`` giving up)."""
    with write_phase() as when:
        row = objects(Approval).select_for_update().filter(pk=approval_id).first()
        if row is None:
            return None
        if approval_lapsed(row.status, row.expires_at, when) and approval_ok(row):
            events: list[EventRow] = []
            _expire(row, when, events)
            seal(events, [], when)
    return _approval_view(row)


def get_approval(approval_id: str) -> ApprovalView | None:
    with reading():
        row = objects(Approval).filter(pk=approval_id).first()
        return _approval_view(row) if row else None


def list_approvals(status: str | None = None) -> list[ApprovalView]:
    """Pending first (oldest first), then the rest, newest first."""
    query = objects(Approval).all()
    if status:
        query = query.filter(status=status)
    rows = list(query.order_by("created_at"))
    pending = [r for r in rows if r.status == ApprovalStatus.PENDING]
    others = [r for r in reversed(rows) if r.status != ApprovalStatus.PENDING]
    return [_approval_view(r) for r in pending + others]


def approvals_for_hash(action_hash: str) -> list[ApprovalView]:
    return [_approval_view(r) for r in objects(Approval).filter(action_hash=action_hash).order_by("created_at")]


def approvals_of_call(action_id: str) -> list[ApprovalView]:
    """The requests one call (an action id) asked for or used, oldest first."""
    with reading():
        rows = list(objects(Approval).filter(Q(action_id=action_id) | Q(consumed_by=action_id)).order_by("created_at"))
    return [_approval_view(r) for r in rows]


def check_presented(call: Call, presented: str, when: dt.datetime,
                    events: list[EventRow]) -> tuple[Call, Approval | None, CTRLRunError | None]:
    """The presented approval of an ``approve`` call, checked in §8.4's order and locked: the call
    stamped with it, the row if it may be used, else why not (nothing sealed; a lapsed one is
    marked expired, its event added to ``events``)."""
    row = objects(Approval).select_for_update().filter(pk=presented).first()
    genuine = row is not None and approval_ok(row)
    roles, approvers = _pinned(row) if genuine else ((), ())
    call = replace(call, approval_id=presented, approver=row.approver if genuine else None,
                   approvers=verified.distinct(approvers))
    error: CTRLRunError | None = None
    if row is None:
        error = ApprovalMismatch(messages.approval_unknown(presented), reason="unknown", approval_id=presented)
    elif not genuine:
        error = ApprovalMismatch(messages.approval_tampered(presented), reason="tampered", approval_id=presented)
    elif row.action_hash != call.action.hash:
        error = ApprovalMismatch(messages.approval_mismatch(presented, row.action_hash, call.action.hash),
                                 reason="mismatch", approval_id=presented)
    elif row.status == ApprovalStatus.DENIED:
        error = ActionDenied(messages.approval_denied(presented, row.approver), reason="approval_denied",
                             action_id=call.action.action_id)
    elif row.status != ApprovalStatus.GRANTED:
        error = ApprovalMismatch(messages.approval_not_granted(presented, str(row.status)), reason=str(row.status),
                                 approval_id=presented)
    elif approval_lapsed(row.status, row.expires_at, when):
        _expire(row, when, events, call)
        error = ApprovalMismatch(messages.approval_expired_ask_again(presented, row.expires_at), reason="expired",
                                 approval_id=presented)
    else:
        found = verified.problem(pinned_roles=roles, pinned_count=row.approvals_required, approvers=approvers,
                                 required_roles=tuple(call.required_roles), required_count=call.approvals_required,
                                 requester=call.action.principal.user)
        if found is not None:
            error = ApprovalMismatch(f"approval {presented} cannot be used: {found[1]}", reason=found[0],
                                     approval_id=presented)
    if genuine and row.action_hash == call.action.hash:
        call = replace(call, precondition_at_request=row.precondition_fingerprint)
        if error is None:
            error = _precondition_refusal(call, presented)
    return call, (row if error is None else None), error


def _precondition_refusal(call: Call, presented: str) -> ApprovalMismatch | None:
    """The state the person saw against the state now (§8.6), or None when neither side has one. A
    refusal leaves the approval granted: the person can look again, or the state come back."""
    at_request, at_recheck = call.precondition_at_request, call.precondition_at_recheck
    if call.precondition_problem is not None:
        reason, message = "precondition_unavailable", messages.precondition_unavailable(presented,
                                                                                        call.precondition_problem)
    elif at_request is None and at_recheck is None:
        return None
    elif at_request is None or at_recheck is None:
        reason, message = "precondition_missing", messages.precondition_missing(presented, at_request is not None)
    elif at_request != at_recheck:
        reason, message = "precondition_changed", messages.precondition_changed(presented, at_request, at_recheck)
    else:
        return None
    return ApprovalMismatch(message, reason=reason, approval_id=presented)


def precondition_data(call: Call) -> dict[str, Any]:
    """The precondition hashes an APPROVAL_CONSUMED / APPROVAL_INVALIDATED event carries (none when
    neither side has one)."""
    if call.precondition_at_request is None and call.precondition_at_recheck is None:
        return {}
    return {"precondition_at_request": call.precondition_at_request,
            "precondition_at_recheck": call.precondition_at_recheck}


def take_presented(call: Call, presented: str | None, when: dt.datetime,
                   events: list[EventRow]) -> tuple[Call, Approval | None, Refused | None]:
    """Check a presented approval for an ``approve`` decision, in §8.4's order.

    Returns the call stamped with the approval, the row to consume once the effect is taken,
    or a refusal whose evidence (and the events so far) is already written. An approval that
    does not carry ctrlrun's signature (a status set around ctrlrun) is refused as ``tampered``
    before anything it says is believed.
    """
    if presented is None or call.decision is not Decision.APPROVE:
        if presented is not None and call.decision is Decision.DENY:
            call = replace(call, approval_id=presented)
        return call, None, None
    call, row, error = check_presented(call, presented, when, events)
    if error is None:
        return call, row, None
    if isinstance(error, ActionDenied):
        events.append(event_row(EventType.APPROVAL_DENIED, call, call.effect_key, {"approver": call.approver}, when,
                                presented))
        events.append(event_row(EventType.ACTION_DENIED, call, call.effect_key, {"reason": "approval_denied"}, when))
        seal(events, [ReceiptSpec(call, Result.DENIED, str(error), None, "approval_denied")], when)
    else:
        events.append(event_row(EventType.APPROVAL_INVALIDATED, call, call.effect_key,
                                {"reason": error.reason, "action_hash": call.action.hash, **precondition_data(call)},
                                when, presented))
        seal(events, [ReceiptSpec(call, Result.BLOCKED, str(error), None)], when)
    return call, None, Refused(error, None, True, call)


def consumption_event(row: Approval, call: Call, when: dt.datetime, *, required: bool) -> EventRow:
    data: dict[str, Any] = {"approver": row.approver}
    if not required:
        data["required"] = False
    data.update(precondition_data(call))
    return event_row(EventType.APPROVAL_CONSUMED, call, call.effect_key, data, when, row.approval_id)


def mark_consumed(row: Approval, call: Call, when: dt.datetime) -> None:
    _move_approval(row, ApprovalStatus.CONSUMED, consumed_at=when, consumed_by=call.action.action_id)


def give_back(approval_id: str | None, effect_key: str, action_id: str, attempt: int, when: dt.datetime,
              why: dict[str, Any]) -> list[EventRow]:
    """Give back the approval that attempt ``attempt`` (call ``action_id``) of ``effect_key`` used, now
    that its record is ``failed`` at that attempt (the caller moved it, in this transaction): consumed
    -> granted, ``returned`` up by one, for the same action hash, until it expires. Only a genuine
    row consumed by this very call, for this key, unexpired, is given back; else nothing. The
    APPROVAL_RETURNED event to seal, or none. ``approval_id`` None: the one this call consumed."""
    query = objects(Approval).select_for_update()
    row = (query.filter(pk=approval_id) if approval_id is not None else
           query.filter(consumed_by=action_id, status=ApprovalStatus.CONSUMED)).first()
    if (row is None or row.status != ApprovalStatus.CONSUMED or row.consumed_by != action_id
            or row.effect_key != effect_key or not approval_ok(row)):
        return []
    if row.expires_at <= when:
        logger.info("approval %s is not given back after attempt %s of %s failed: it expired at %s", row.approval_id,
                    attempt, effect_key, evidence_time(row.expires_at))
        return []
    _move_approval(row, ApprovalStatus.GRANTED, consumed_at=None, consumed_by=None, returned=row.returned + 1)
    return [event_row(EventType.APPROVAL_RETURNED, action_id, effect_key, {"attempt": attempt, "action_id": action_id,
                                                                           **why}, when, row.approval_id)]


def matching_approval(call: Call, presented: str, when: dt.datetime) -> tuple[Approval | None, Call]:
    """An approval presented on an allowed call is used up only if it is for exactly this call."""
    row = objects(Approval).select_for_update().filter(pk=presented).first()
    if (row is None or not approval_ok(row) or row.action_hash != call.action.hash
            or row.status != ApprovalStatus.GRANTED or approval_lapsed(row.status, row.expires_at, when)):
        logger.info("approval %s presented on allowed call %s was not used (it does not match or is not granted)",
                    presented, call.action.action_id)
        return None, call
    return row, replace(call, approval_id=presented, approver=row.approver,
                        approvers=verified.distinct(_pinned(row)[1]))
