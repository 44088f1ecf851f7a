"""Mail about approval requests (``ctrlrun.notify``): who is told, how sending went, and each link's one use.

Bookkeeping beside the approvals, not evidence: nothing is sealed here, and nothing here answers a
request. Every row is signed (``signatures.delivery_ok``, ``signatures.link_use_ok``) and guarded
(guard version 9): a delivery keeps who and why, changes only while ``pending``, and is never deleted;
a link's use is never changed or deleted, so a used link stays used.

Sending is at most once per attempt across processes: ``begin_attempt`` claims a due row (its
``attempts`` up by one and ``next_try`` moved past the attempt) in one short transaction before any
mail leaves, so the loop and a request's own first try never send the same attempt twice.
"""
from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterable, Sequence

from django.db import IntegrityError, transaction
from django.db.models import Q

from ..models import Delivery, LinkUse
from ..values import DeliveryView, LinkUseView
from .base import alias, objects, read_clock, reading, write_phase
from .people import Person
from .signatures import delivery_ok, link_use_ok, sign_delivery, sign_link_use

__all__ = ["plan_deliveries", "deliveries_for", "due_deliveries", "begin_attempt", "finish_attempt",
           "delivery_by_nonce", "use_link", "link_use", "with_permission", "active_person"]

_FIELDS = [f for f in DeliveryView.__dataclass_fields__ if f != "signature_ok"]
PENDING, SENT, FAILED, DROPPED = Delivery.PENDING, Delivery.SENT, Delivery.FAILED, Delivery.DROPPED


def _view(row: Delivery) -> DeliveryView:
    return DeliveryView(**{f: getattr(row, f) for f in _FIELDS}, signature_ok=delivery_ok(row))


def plan_deliveries(approval_id: str, people: Iterable[tuple[Person, str, str | None]]) -> list[DeliveryView]:
    """One pending delivery per (person, basis, why not) for the request, due now; a person with a
    reason not to be told (no address, the requester) is recorded ``dropped`` with it. A person
    already planned for this request keeps their row. Returns every delivery of the request."""
    with write_phase() as when:
        known = set(objects(Delivery).filter(approval_id=approval_id).values_list("recipient", flat=True))
        for person, basis, why_not in people:
            if person.username in known:
                continue
            known.add(person.username)
            row = Delivery(approval_id=approval_id, recipient=person.username, address=person.email or "",
                           basis=basis, status=PENDING, attempts=0, created_at=when, next_try=when,
                           link_nonce=secrets.token_hex(16))
            if why_not is not None:  # inserted pending (the guard's rule), then dropped with the reason
                row.next_try = None
            sign_delivery(row)
            row.save(using=alias(), force_insert=True)
            if why_not is not None:
                _finish(row, DROPPED, why_not, None, None)
    return deliveries_for(approval_id)


def deliveries_for(approval_id: str) -> list[DeliveryView]:
    with reading():
        return [_view(row) for row in objects(Delivery).filter(approval_id=approval_id).order_by("recipient")]


def due_deliveries(limit: int | None = None, approval_id: str | None = None) -> tuple[list[DeliveryView], int]:
    """The pending deliveries whose next try is due on the store's clock (oldest first), and how many
    due rows were skipped because they do not carry ctrlrun's signature (never sent)."""
    with reading():
        now = read_clock()
        query = objects(Delivery).filter(status=PENDING, next_try__lte=now)
        if approval_id is not None:
            query = query.filter(approval_id=approval_id)
        rows = [_view(row) for row in query.order_by("next_try", "id")]
    genuine = [row for row in rows if row.signature_ok]
    return (genuine[:limit] if limit is not None else genuine), len(rows) - len(genuine)


def begin_attempt(delivery_id: int, hold: dt.timedelta) -> tuple[DeliveryView | None, dt.datetime]:
    """Claim the next attempt of a due, genuine, pending delivery: ``attempts`` up by one and the next
    try moved ``hold`` on (so a process that dies mid-send leaves it to be tried again then). None when
    it is not due any more (another process claimed it, or it was finished); with the store's time."""
    with write_phase() as when:
        row = objects(Delivery).select_for_update().filter(pk=delivery_id).first()
        if (row is None or row.status != PENDING or not delivery_ok(row) or row.next_try is None
                or row.next_try > when):
            return None, when
        row.attempts += 1
        row.next_try = when + hold
        _save(row, ["attempts", "next_try"])
        return _view(row), when


def finish_attempt(delivery_id: int, attempt: int, status: str, error: str | None,
                   retry_at: dt.datetime | None) -> DeliveryView | None:
    """Record how attempt ``attempt`` went: ``sent``; ``pending`` again with ``retry_at`` (it failed and
    will be retried); ``failed`` (given up); or ``dropped`` (the person is no longer to be told).
    Nothing when the row moved on meanwhile (another attempt, a signature that no longer holds)."""
    with write_phase() as when:
        row = objects(Delivery).select_for_update().filter(pk=delivery_id).first()
        if row is None or row.status != PENDING or row.attempts != attempt or not delivery_ok(row):
            return None
        _finish(row, status, error, retry_at, when if status == SENT else None)
        return _view(row)


def _finish(row: Delivery, status: str, error: str | None, retry_at: dt.datetime | None,
            sent_at: dt.datetime | None) -> None:
    row.status, row.last_error, row.next_try, row.sent_at = status, error, retry_at, sent_at
    _save(row, ["status", "last_error", "next_try", "sent_at"])


def _save(row: Delivery, fields: Sequence[str]) -> None:
    sign_delivery(row)
    row.save(using=alias(), update_fields=[*fields, "mac"])


def delivery_by_nonce(nonce: str) -> DeliveryView | None:
    with reading():
        row = objects(Delivery).filter(link_nonce=nonce).first()
        return _view(row) if row is not None else None


def _link_view(row: LinkUse) -> LinkUseView:
    return LinkUseView(row.nonce, row.approval_id, row.used_by, row.used_at, signature_ok=link_use_ok(row))


def link_use(nonce: str) -> LinkUseView | None:
    """The recorded use of a link, signed or not (any row under the nonce makes it used)."""
    with reading():
        row = objects(LinkUse).filter(pk=nonce).first()
        return _link_view(row) if row is not None else None


def use_link(nonce: str, approval_id: str, username: str) -> tuple[bool, LinkUseView]:
    """Record that a link was used, once: (True, the use) for the one caller who recorded it, else
    (False, the use recorded before). Two concurrent openings: the primary key lets one win."""
    with write_phase() as when:
        earlier = objects(LinkUse).select_for_update().filter(pk=nonce).first()
        if earlier is not None:
            return False, _link_view(earlier)
        row = LinkUse(nonce=nonce, approval_id=approval_id, used_by=username, used_at=when)
        sign_link_use(row)
        try:
            with transaction.atomic(using=alias()):  # a savepoint: losing the race leaves the phase usable
                row.save(using=alias(), force_insert=True)
        except IntegrityError:
            earlier = objects(LinkUse).filter(pk=nonce).first()
            if earlier is None:
                raise
            return False, _link_view(earlier)
        return True, _link_view(row)


def _person(user: object) -> Person:
    from django.contrib.auth import get_user_model  # django.contrib.auth: a project's, never a plain script's

    model = get_user_model()
    return Person(getattr(user, model.USERNAME_FIELD), getattr(user, model.get_email_field_name(), "") or "")


def with_permission(permission: str) -> list[Person]:
    """Every active user who has ``permission`` (``app_label.codename``) as Django decides it: their
    own, a group's, or a superuser's. Reads only."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    model = get_user_model()
    app_label, _, codename = permission.partition(".")
    wanted = Permission.objects.db_manager(alias()).filter(codename=codename, content_type__app_label=app_label)
    users = model._default_manager.db_manager(alias()).filter(is_active=True).filter(
        Q(is_superuser=True) | Q(user_permissions__in=wanted) | Q(groups__permissions__in=wanted))
    return [_person(u) for u in users.distinct().order_by(model.USERNAME_FIELD)]


def active_person(username: str) -> tuple[Person | None, object | None]:
    """The active user named ``username`` (as a Person, and the user object for permission checks)."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    user = model._default_manager.db_manager(alias()).filter(is_active=True, **{model.USERNAME_FIELD: username}).first()
    return (_person(user), user) if user is not None else (None, None)
