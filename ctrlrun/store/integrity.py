"""The signed rows beside the chains, checked by ``receipts --verify-chain``: delegations, budget
charges, stored policy texts, recorded chain checks and paused runs.

Each must carry ctrlrun's signature over its identity and every column a decision or a page reads;
a delegation must also agree with the event chain (its ``DELEGATION_CREATED``, and, once revoked,
its ``DELEGATION_REVOKED``). A full check reads every such row; an incremental one reads those
written or changed since its starting point (by their own times, less the margin the caller gives)
and the delegations the new events name.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any

from django.db.models import Q

from ..models import BudgetLedger, ChainCheck, Delivery, Event, LinkUse, PausedRun, PolicyDocument
from ..models import Delegation as DelegationRow
from ..receipts import ChainBreak
from .base import objects
from .signatures import check_ok, delegation_ok, delivery_ok, ledger_ok, link_use_ok, paused_ok, policy_document_ok

_DELEGATION_COLUMNS = ("delegation_id", "parent_id", "depth", "grant_json", "agent", "created_by_agent",
                       "created_by_user", "created_via", "created_at", "revoked_at", "revoked_by", "mac")
_LEDGER_COLUMNS = ("grant_id", "metric", "amount", "effect_key", "attempt", "consumed_at", "released_at", "n", "cum",
                   "mac", "id")


def _unsigned(kind: str, subject: str, what: str, consequence: str) -> ChainBreak:
    return ChainBreak("signature_invalid", None, f"{what} does not carry ctrlrun's signature: it was written or "
                      f"changed outside ctrlrun, and {consequence}", kind=kind, subject=subject)


def delegation_events(rows: Iterable[Any]) -> dict[str, set[str]]:
    """Which delegations the given events (rows with ``type`` and ``data`` text) create or revoke."""
    told: dict[str, set[str]] = {}
    for row in rows:
        if row.type not in ("DELEGATION_CREATED", "DELEGATION_REVOKED"):
            continue
        try:
            data = json.loads(row.data) if isinstance(row.data, str) else row.data
        except ValueError:
            continue  # an unreadable event is already a named break
        if isinstance(data, dict) and isinstance(data.get("delegation_id"), str):
            told.setdefault(data["delegation_id"], set()).add(row.type)
    return told


def _delegation_breaks(values: tuple, told: set[str], *, whole_story: bool) -> list[ChainBreak]:
    ident, revoked_at = values[0], values[9]
    if not delegation_ok(values[:-1], values[-1]):
        return [_unsigned("delegation", str(ident), f"delegation {ident} (to {values[4]!r}, under {values[1]!r})",
                          "grants nothing: a call that would rest on it is refused authority_unreadable")]
    if "DELEGATION_REVOKED" in told and revoked_at is None:
        return [ChainBreak("rewound", None, f"delegation {ident} says it is not revoked, but the event chain records "
                           f"its revocation: an older row was put back", kind="delegation", subject=str(ident))]
    missing = [kind for kind, needed in (("DELEGATION_CREATED", True), ("DELEGATION_REVOKED", revoked_at is not None))
               if needed and kind not in told] if whole_story else []
    if not missing:
        return []
    return [ChainBreak("missing", None, f"delegation {ident} is signed, but the event chain holds no "
                       f"{' or '.join(missing)} for it: the row and the chain disagree (events were removed)",
                       kind="delegation", subject=str(ident))]


def row_breaks(since: dt.datetime | None, walked: dict[str, set[str]], upto_event_seq: int
               ) -> tuple[list[ChainBreak], int]:
    """The breaks of the signed rows beside the chains, and how many rows were checked.

    ``since`` None (a full check): every row, each delegation against its whole story in the event
    chain (up to ``upto_event_seq``). Else (incremental): the rows written or changed since then, and
    the delegations the walked events name (``walked``: what :func:`delegation_events` found in them),
    each against what those events say."""
    out: list[ChainBreak] = []
    checked = 0
    delegations = objects(DelegationRow).all()
    if since is not None:
        delegations = delegations.filter(Q(created_at__gte=since) | Q(revoked_at__gte=since) | Q(pk__in=sorted(walked)))
        told = walked
    else:
        told = delegation_events(objects(Event).filter(
            type__in=("DELEGATION_CREATED", "DELEGATION_REVOKED"), seq__isnull=False, seq__lte=upto_event_seq)
            .only("type", "data").iterator(chunk_size=2000))
    for row in delegations.order_by("created_at", "delegation_id").values_list(*_DELEGATION_COLUMNS).iterator(
            chunk_size=2000):
        checked += 1
        out += _delegation_breaks(row, told.get(row[0], set()), whole_story=since is None)

    ledger = objects(BudgetLedger).all()
    if since is not None:
        ledger = ledger.filter(Q(consumed_at__gte=since) | Q(released_at__gte=since))
    for values in ledger.order_by("id").values_list(*_LEDGER_COLUMNS).iterator(chunk_size=2000):
        checked += 1
        if not ledger_ok(values[:9], values[9]):
            out.append(_unsigned("ledger", str(values[10]), f"budget charge {values[10]} ({values[2]} {values[1]} on "
                                 f"{values[0]!r} by {values[3]} attempt {values[4]}"
                                 f"{', released' if values[6] is not None else ''})",
                                 "its release, its amount, or its place in its chain, is not ctrlrun's"))

    documents = objects(PolicyDocument).all()
    if since is not None:
        documents = documents.filter(first_seen__gte=since)
    for row in documents.order_by("first_seen", "hash").iterator():
        checked += 1
        if not policy_document_ok(row):
            out.append(_unsigned("policy", row.hash, f"the policy text stored under {row.hash}",
                                 "no page explains a decision with it; a process deciding by that hash refuses to act"))

    checks = objects(ChainCheck).all()
    if since is not None:
        checks = checks.filter(checked_at__gte=since)
    for row in checks.order_by("id").iterator():
        checked += 1
        if not check_ok(row):
            out.append(_unsigned("check", str(row.id), f"chain check {row.id} ({'intact' if row.ok else 'broken'}, "
                                 f"{row.mode}, up to receipt {row.receipt_seq})",
                                 "no check starts from it, and the front page does not take it for the last check"))
    paused = objects(PausedRun).all()
    if since is not None:
        paused = paused.filter(created_at__gte=since)
    for row in paused.order_by("id").iterator():
        checked += 1
        if not paused_ok(row):
            out.append(_unsigned("paused", row.approval_id, f"the run paused on {row.approval_id} ({row.framework}, "
                                 f"resumer {row.resume_with!r})", "it is never resumed"))
    mail, mailed = _mail_rows(since)
    return out + mail, checked + mailed


def _mail_rows(since: Any) -> tuple[list[ChainBreak], int]:
    """Mail deliveries and link uses (``ctrlrun.notify``) that do not carry ctrlrun's signature, and how
    many rows were checked."""
    out: list[ChainBreak] = []
    checked = 0
    deliveries, uses = objects(Delivery).all(), objects(LinkUse).all()
    if since is not None:
        deliveries, uses = deliveries.filter(created_at__gte=since), uses.filter(used_at__gte=since)
    for row in deliveries.order_by("id").iterator():
        checked += 1
        if not delivery_ok(row):
            out.append(_unsigned("delivery", row.link_nonce, f"the mail about {row.approval_id} to {row.recipient!r} "
                                 f"({row.status})", "it is never sent, and the approval's page says so"))
    for row in uses.order_by("used_at").iterator():
        checked += 1
        if not link_use_ok(row):
            out.append(_unsigned("link", row.nonce, f"the use of a mail link about {row.approval_id} by "
                                 f"{row.used_by!r}", "it can only make that link refused, never usable"))
    return out, checked
