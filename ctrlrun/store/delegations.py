"""Delegations (policy v3, §C3): grants handed down at runtime, revoked once, never deleted.

A delegation is created, or refused, in one phase: the live rows are read, the request is judged
(``Authority.delegation_refusal``, pure) and the row and its ``DELEGATION_CREATED`` event, or the
``DELEGATION_REJECTED`` event, are written in that same transaction, on the events' chain
(``seal``). A revoke is one conditional UPDATE (``revoked_at IS NULL``) and its
``DELEGATION_REVOKED`` event, in one phase: only the first revoke of a row changes it; the
database refuses any other change (``ctrlrun.guard``).

Every row is signed (``signatures.delegation_fields``: its id and every column), and re-signed by
its revoke. A row that does not verify (inserted or changed by the application's database role) or
cannot be read is handed over with its ``problem``, and authority refuses whatever rests on it
(``authority_unreadable``); ``receipts --verify-chain`` names it.

What a call reads (``delegations_for``, the one read the kernel makes when the policy has a
delegable grant) is only what can apply to it: the delegations to its agent (indexed: a delegated
grant names one literal agent), the hop it presents, and every ancestor of those up to its root
grant, in one recursive statement whose cost follows the call's own chains, never the table. A
delegation is judged on the chain of its parent alone (``delegation_chain``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from django.db import connections

from ..policy.authority import CREATED_VIA, Authority, Delegation, Grant
from ..canonical import new_id
from ..errors import InvalidArgument
from ..models import Delegation as DelegationRow
from ..policy import grant_from_json, grant_json
from ..states import EventType
from . import sql
from .base import alias, as_datetime, dialect, objects, reading, statements, write_phase
from .chain import event_row, seal
from .signatures import delegation_mac, delegation_ok

_ID = re.compile(r"dlg_[0-9a-f]{32}\Z")
_FIELDS = sql.DELEGATION_COLUMNS
#: Grants read back from rows, by (id, grant_json): the same text always reads the same grant.
_parsed: dict[tuple[str, str], Grant | str] = {}


@dataclass(frozen=True)
class Rejected:
    """A delegation refused (its ``DELEGATION_REJECTED`` event is written): why, and on what."""

    reason: str
    dimension: str | None
    message: str


@dataclass(frozen=True)
class Revoked:
    """What a revoke did: ``changed`` False when the row was already revoked (at ``revoked_at``)."""

    delegation: Delegation
    changed: bool


def _grant(ident: str, text: str) -> Grant | str:
    key = (ident, text)
    found = _parsed.get(key)
    if found is None:
        try:
            found = grant_from_json(text, ident)
        except ValueError as exc:
            found = str(exc)
        if len(_parsed) > 4096:
            _parsed.clear()
        _parsed[key] = found
    return found


def _delegation(values: tuple[Any, ...]) -> Delegation:
    ident, parent_id, depth, text, subject, agent, user, via, created_at, revoked_at, revoked_by, mac = values
    problem = None
    grant = _grant(ident, text) if isinstance(ident, str) and isinstance(text, str) else "grant_json is missing"
    if not delegation_ok(values[:-1], mac):
        problem, grant = ("it does not carry ctrlrun's signature: it was written or changed outside ctrlrun "
                          "(receipts --verify-chain names it)"), None
    elif isinstance(grant, str):
        problem, grant = grant, None
    elif not isinstance(ident, str) or not _ID.match(ident):
        problem, grant = f"{ident!r} is not a delegation id (dlg_ and 32 hex digits)", None
    elif via not in CREATED_VIA:
        problem, grant = f"created_via {via!r} is not one of {', '.join(CREATED_VIA)}", None
    elif not isinstance(depth, int) or depth < 1:
        problem, grant = f"depth {depth!r} is not a positive int", None
    elif revoked_at is not None and not revoked_by:
        problem, grant = "revoked_at is set but revoked_by is not", None
    elif grant.agent != subject:
        problem, grant = f"its agent column {subject!r} is not its grant's agent {grant.agent!r}", None
    return Delegation(ident, parent_id, depth, grant, agent, user, via, created_at, revoked_at, revoked_by, problem)


def _all() -> list[Delegation]:
    return [_delegation(values) for values in objects(DelegationRow).order_by("created_at", "delegation_id")
            .values_list(*_FIELDS)]


def list_delegations() -> list[Delegation]:
    """Every delegation row (revoked ones too): the console's tree and the commands that list them.
    A call never reads this (``delegations_for``)."""
    with reading():
        return _all()


def _select(statement: str, params: list[Any]) -> list[Delegation]:
    """Delegations by raw SQL (``sql.DELEGATION_COLUMNS`` first), their times read as the ORM reads them."""
    connection = connections[alias()]
    with statements() as cursor:
        rows = cursor.execute(statement, params).fetchall()
    out = []
    for row in rows:
        values = list(row)
        for index in (8, 9):  # created_at, revoked_at
            values[index] = as_datetime(values[index], connection)
        out.append(_delegation(tuple(values)))
    return out


def _with_ancestors(start: str, params: list[Any]) -> list[Delegation]:
    """The rows ``start`` (a condition on ``"d"``) selects, and every ancestor of theirs (one statement)."""
    return _select(sql.delegations_up(start), params)


def _beneath(ident: str) -> list[Delegation]:
    """The rows below ``ident``, in creation order."""
    return _select(sql.DELEGATIONS_DOWN, [ident])


def delegations_for(agent: str, hop: str | None = None) -> list[Delegation]:
    """What can apply to one call: the delegations to ``agent``, the ``hop`` it presents, and all their
    ancestors (one indexed statement)."""
    with reading():
        if hop is not None:
            return _with_ancestors('("d"."agent" = %s OR "d"."delegation_id" = %s)', [agent, hop])
        return _with_ancestors('"d"."agent" = %s', [agent])


def delegation_chain(ident: str) -> list[Delegation]:
    """One delegation (or none, for a grant id) and its ancestors: what judging a new delegation from
    ``ident`` needs."""
    with reading():
        return _with_ancestors('"d"."delegation_id" = %s', [ident])


def get_delegation(delegation_id: str) -> Delegation | None:
    with reading():
        values = objects(DelegationRow).filter(pk=delegation_id).values_list(*_FIELDS).first()
        return _delegation(values) if values else None


def create_delegation(authority: Authority, parent_id: str, grant: Grant, *, agent: str, user: str | None,
                      via: str, action_id: str | None = None) -> Delegation | Rejected:
    """Judge and write one delegation of ``grant`` from ``parent_id`` by ``agent``/``user``, in one phase."""
    if via not in CREATED_VIA:
        raise InvalidArgument(f"created_via must be one of {', '.join(CREATED_VIA)}, not {via!r}")
    text = grant_json(grant)
    try:  # the row must read back as this very grant: one that does not would refuse every action
        again = grant_from_json(text, "dlg_" + "0" * 32)
    except ValueError as exc:
        raise InvalidArgument(f"this grant cannot be stored as a delegation: {exc}") from None
    if grant_json(again) != text:
        raise InvalidArgument("this grant cannot be stored as a delegation: it does not read back as itself")
    with write_phase() as when:
        rows = _with_ancestors('"d"."delegation_id" = %s', [parent_id])
        judged = authority.delegation_refusal(parent_id, grant, agent, user, now=when, delegations=rows)
        if not isinstance(judged, int):
            reason, dimension, message = judged
            data: dict[str, Any] = {"reason": reason, "parent_id": parent_id}
            if dimension is not None:
                data["dimension"] = dimension
            seal([event_row(EventType.DELEGATION_REJECTED, None, None, data, when)], [], when)
            return Rejected(reason, dimension, message)
        ident = new_id("dlg_")
        row = DelegationRow(delegation_id=ident, parent_id=parent_id, depth=judged, grant_json=text,
                            agent=grant.agent, created_by_agent=agent, created_by_user=user, created_via=via,
                            created_at=when)
        row.mac = delegation_mac(ident, parent_id, judged, text, grant.agent, agent, user, via, when, None, None)
        row.save(using=objects(DelegationRow).db, force_insert=True)
        seal([event_row(EventType.DELEGATION_CREATED, None, None, {
            "delegation_id": ident, "parent_id": parent_id, "depth": judged, "created_by_agent": agent,
            "created_by_user": user, "created_via": via, **({"action_id": action_id} if action_id else {})}, when)],
              [], when)
    return Delegation(ident, parent_id, judged, replace(grant, id=ident), agent, user, via, when)


def revoke_delegation(delegation_id: str, revoked_by: str) -> Revoked | None:
    """Revoke one delegation (and so everything beneath it): None when there is no such row; an
    already revoked row is left as it is (``changed`` False), with no second event."""
    if not isinstance(revoked_by, str) or not revoked_by.strip():
        raise InvalidArgument("a revoke names who revokes (revoked_by)")
    with write_phase() as when:
        values = objects(DelegationRow).filter(pk=delegation_id).values_list(*_FIELDS).first()
        if values is None:
            return None
        changed = 0
        if values[9] is None:  # re-signed with its revocation, in the UPDATE that checks it is the first
            mac = delegation_mac(*values[:9], when, revoked_by)
            changed = objects(DelegationRow).filter(pk=delegation_id, revoked_at__isnull=True).update(
                revoked_at=when, revoked_by=revoked_by, mac=mac)
            values = objects(DelegationRow).filter(pk=delegation_id).values_list(*_FIELDS).first()
        if changed:
            seal([event_row(EventType.DELEGATION_REVOKED, None, None,
                            {"delegation_id": delegation_id, "revoked_by": revoked_by}, when)], [], when)
    return Revoked(_delegation(values), bool(changed))


def delegations_beneath(delegation_id: str, rows: list[Delegation] | None = None) -> list[Delegation]:
    """Every delegation below ``delegation_id`` (or below the grant of that id), in creation order."""
    if rows is None:
        with reading():
            rows = _beneath(delegation_id)
    below: set[str] = {delegation_id}
    found: list[Delegation] = []
    grown = True
    while grown:
        grown = False
        for row in rows:
            if row.parent_id in below and row.id not in below:
                below.add(row.id)
                found.append(row)
                grown = True
    order = {row.id: index for index, row in enumerate(rows)}
    return sorted(found, key=lambda row: order[row.id])


def revoked_beneath(call_delegations: tuple[str, ...]) -> str | None:
    """Inside a reservation: the first of the delegations a call's authority rests on that is revoked
    by now, or None. On PostgreSQL the rows are read FOR SHARE, so a revoke in flight is waited for
    and then seen: a call either takes its key before the revoke commits, or is refused after it."""
    if not call_delegations:
        return None
    lock = dialect().SHARE_LOCK
    with statements() as cursor:
        rows = cursor.execute(sql.delegations_revoked(len(call_delegations), lock), list(call_delegations)).fetchall()
    found = {ident: revoked for ident, revoked in rows}
    for ident in call_delegations:  # in chain order: the nearest revoked one is named
        if ident not in found or found[ident] is not None:
            return ident
    return None

