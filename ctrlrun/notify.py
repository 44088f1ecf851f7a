"""Approvers hear about a request: a mail to the people who may answer it, with a link that works once.

After an approval request commits (never inside a store phase: a receiver of
``ctrlrun.signals.approval_requested``, connected by ``settings.CTRLRUN_NOTIFY_APPROVERS = True`` or
``connect_signal_receiver()``), ``plan`` decides who is told and records one delivery per person
(``store.notifications``); the first attempt is made at once (``CTRLRUN_NOTIFY_AT_ONCE``), and a
failed one is retried with backoff by ``manage.py notify --loop`` (``run_once``). Nothing here can
fail the agent's call: every error is logged (logger ``ctrlrun.notify``) and kept on the delivery.

Who is told (``recipients``), each an active console user with an email address:

- ``CTRLRUN_NOTIFY_RECIPIENTS`` (usernames), when ``CTRLRUN_NOTIFY_RECIPIENTS_OVERRIDE`` is True;
- else the holders of every role the request pins (``approver_role`` of the controls its verdict
  cites, pinned on the request's signed row when it was asked: ``ApprovalView.required_roles``);
- else, when it pins none, the ``CTRLRUN_NOTIFY_RECIPIENTS`` list;
- else everyone with the ``ctrlrun.decide_approval`` permission (the console's approvers).

The person the call was made for is never told (they cannot answer it), and a person is checked
again before each attempt: one who left the role (or the list, or lost the permission), was
deactivated or changed address is dropped, and so is every mail of a request no longer pending.

The link (``link_token``) is signed with Django's signing (``SECRET_KEY``, its own salt) and names
the delivery's nonce, the request and the addressee, with the time it was issued on the store's
clock. It expires after ``CTRLRUN_NOTIFY_LINK_SECONDS``, works once (``store.notifications.use_link``),
only for its addressee once signed in, and answers nothing: it leads to the request's page, where the
person still chooses Approve or Deny and confirms (``check_link``).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from . import store
from .display import dumps, reveal
from .errors import InvalidArgument
from .identity import same_person
from .roles import RequiredRole
from .states import ApprovalStatus, effective_approval_status
from .store.people import Person
from .times import when_text

logger = logging.getLogger("ctrlrun.notify")

__all__ = ["Settings", "settings", "roles_for", "recipients", "basis_text", "plan", "attempt", "run_once", "Report",
           "link_token", "check_link", "LinkCheck", "subject_for", "connect_signal_receiver",
           "disconnect_signal_receiver"]

SALT = "ctrlrun.notify.link"
PERMISSION = "ctrlrun.decide_approval"
#: Waits between attempts double from the backoff setting up to this.
BACKOFF_MAX = dt.timedelta(hours=1)
#: A subject shows at most this many characters of the action's name.
SUBJECT_ACTION_CHARS = 80


@dataclass(frozen=True)
class Settings:
    base_url: str | None
    recipients: tuple[str, ...]
    override: bool
    from_email: str | None
    link_lifetime: dt.timedelta
    max_attempts: int
    backoff: dt.timedelta
    at_once: bool


def _positive(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidArgument(f"settings.{name} must be a positive number, got {value!r}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"settings.{name} must be True or False, got {value!r}")
    return value


def settings() -> Settings:
    """The notification settings, checked: a wrong one is an ``InvalidArgument`` naming it."""
    from django.conf import settings as django_settings

    def get(name: str, default: Any) -> Any:
        return getattr(django_settings, name, default)

    names = get("CTRLRUN_NOTIFY_RECIPIENTS", ())
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(
            isinstance(n, str) and n.strip() for n in names):
        raise InvalidArgument("settings.CTRLRUN_NOTIFY_RECIPIENTS must be a list of console usernames, got "
                              f"{names!r}")
    base = get("CTRLRUN_NOTIFY_BASE_URL", None)
    if base is not None and (not isinstance(base, str) or not base.startswith(("https://", "http://"))):
        raise InvalidArgument("settings.CTRLRUN_NOTIFY_BASE_URL must be the console's address as people reach it, "
                              f"starting https:// (e.g. 'https://ops.example.com'), got {base!r}")
    attempts = _positive("CTRLRUN_NOTIFY_MAX_ATTEMPTS", get("CTRLRUN_NOTIFY_MAX_ATTEMPTS", 5))
    if not isinstance(attempts, int):
        raise InvalidArgument(f"settings.CTRLRUN_NOTIFY_MAX_ATTEMPTS must be a whole number, got {attempts!r}")
    return Settings(
        base_url=base.rstrip("/") if base else None,
        recipients=tuple(n.strip() for n in names),
        override=_flag("CTRLRUN_NOTIFY_RECIPIENTS_OVERRIDE", get("CTRLRUN_NOTIFY_RECIPIENTS_OVERRIDE", False)),
        from_email=get("CTRLRUN_NOTIFY_FROM", None),
        link_lifetime=dt.timedelta(seconds=_positive("CTRLRUN_NOTIFY_LINK_SECONDS",
                                                     get("CTRLRUN_NOTIFY_LINK_SECONDS", 900))),
        max_attempts=attempts,
        backoff=dt.timedelta(seconds=_positive("CTRLRUN_NOTIFY_BACKOFF_SECONDS",
                                               get("CTRLRUN_NOTIFY_BACKOFF_SECONDS", 60))),
        at_once=_flag("CTRLRUN_NOTIFY_AT_ONCE", get("CTRLRUN_NOTIFY_AT_ONCE", True)),
    )


# --------------------------------------------------------------------------- who is told


def roles_for(approval: Any) -> tuple[RequiredRole, ...]:
    """The roles the request pins: its row's ``required_roles``, fixed when it was asked (signed, and
    kept for the row's life by the guard), so a policy edited since cannot change who is told."""
    return tuple(approval.required_roles)


def _role_basis(roles: tuple[RequiredRole, ...]) -> str:
    return "role:" + json.dumps(sorted({r.role for r in roles}), ensure_ascii=False)


def basis_text(basis: str) -> str:
    """Why a person is told, in words (the page and the mail)."""
    if basis.startswith("role:"):
        try:
            roles = json.loads(basis[5:])
        except ValueError:
            return reveal(basis)
        return ("you hold the role" + ("s " if len(roles) > 1 else " ") + ", ".join(reveal(str(r)) for r in roles)
                + " the request pins")
    if basis == "setting":
        return "you are in settings.CTRLRUN_NOTIFY_RECIPIENTS"
    if basis == "permission":
        return "you may decide approvals (ctrlrun.decide_approval) and the request pins no role"
    return reveal(basis)


def _holders_of_all(roles: tuple[RequiredRole, ...]) -> list[Person]:
    """Who holds every role (an approver must hold each one the request pins)."""
    names = sorted({r.role for r in roles})
    found = {p.username: p for p in store.people.holders(names[0])}
    for role in names[1:]:
        held = {p.username for p in store.people.holders(role)}
        found = {name: person for name, person in found.items() if name in held}
    return [found[name] for name in sorted(found)]


def _listed(names: tuple[str, ...]) -> list[Person]:
    people = []
    for name in names:
        person, _ = store.notifications.active_person(name)
        if person is None:
            logger.warning("settings.CTRLRUN_NOTIFY_RECIPIENTS names %r, who is not an active user: not told", name)
        else:
            people.append(person)
    return people


def recipients(approval: Any, config: Settings | None = None) -> list[tuple[Person, str, str | None]]:
    """(person, basis, why not) for each person to record: ``why not`` None for those to tell."""
    config = config or settings()
    roles = roles_for(approval)
    if config.override and config.recipients:
        chosen, basis = _listed(config.recipients), "setting"
    elif roles:
        chosen, basis = _holders_of_all(roles), _role_basis(roles)
    elif config.recipients:
        chosen, basis = _listed(config.recipients), "setting"
    else:
        chosen, basis = store.notifications.with_permission(PERMISSION), "permission"
    out = []
    for person in chosen:
        out.append((person, basis, _unaddressable(person, approval)))
    return out


def _unaddressable(person: Person, approval: Any) -> str | None:
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    if approval.user is not None and same_person(approval.user, person.username):
        return "the request was made on their behalf: they cannot answer it"
    if not person.email:
        return "their account has no email address"
    try:
        validate_email(person.email)
    except ValidationError:
        return f"their email address {reveal(person.email)} is not a valid address"
    return None


def plan(approval_id: str, config: Settings | None = None) -> list[Any]:
    """Record who is told about request ``approval_id`` (once: planned again, nothing changes)."""
    approval = store.get_approval(approval_id)
    if approval is None or not approval.signature_ok:
        logger.warning("request %s is missing or does not carry ctrlrun's signature: nobody is told", approval_id)
        return []
    people = recipients(approval, config)
    if not people:
        logger.warning("nobody is told about request %s (%s): no active user with an email may answer it",
                       approval_id, reveal(approval.action))
    return store.notifications.plan_deliveries(approval_id, people)


def _still_to_tell(delivery: Any, approval: Any, config: Settings) -> str | None:
    """Why ``delivery`` is no longer to be sent, or None."""
    if approval is None or not approval.signature_ok:
        return "the request is missing or does not carry ctrlrun's signature"
    now = store.now()
    status = effective_approval_status(approval.status, approval.expires_at, now)
    if status != ApprovalStatus.PENDING:
        return f"the request is already {status}"
    person, user = store.notifications.active_person(delivery.recipient)
    if person is None:
        return "the user is no longer active"
    if person.email != delivery.address:
        return "the user's email address changed since the mail was planned"
    if not getattr(user, "is_staff", False):
        return "they cannot sign in to the console (not staff), where the link leads"
    basis = delivery.basis
    if basis.startswith("role:"):
        for role in json.loads(basis[5:]):
            if not store.people.holds(user, role):
                return f"they no longer hold the role {reveal(role)}"
    elif basis == "setting":
        if delivery.recipient not in config.recipients:
            return "they are no longer in settings.CTRLRUN_NOTIFY_RECIPIENTS"
    elif basis == "permission":
        if not user.has_perm(PERMISSION):  # type: ignore[attr-defined]
            return "they may no longer decide approvals (ctrlrun.decide_approval)"
    return None


# --------------------------------------------------------------------------- the mail


def subject_for(approval: Any) -> str:
    """One header line whatever the action's name holds: every hidden character (newlines, bidi
    controls) shown as its escape, cut to a length a mail client shows."""
    action = reveal(str(approval.action))
    if len(action) > SUBJECT_ACTION_CHARS:
        action = action[:SUBJECT_ACTION_CHARS - 1] + "…"
    return f"ctrlrun: approve {action}? (request {approval.approval_id})"


def link_token(delivery: Any, issued: dt.datetime) -> str:
    from django.core import signing

    return signing.dumps({"n": delivery.link_nonce, "a": delivery.approval_id, "u": delivery.recipient,
                          "t": int(issued.timestamp())}, salt=SALT)


def link_url(delivery: Any, issued: dt.datetime, config: Settings) -> str:
    from django.contrib.admin.utils import quote
    from django.urls import reverse

    if not config.base_url:
        raise InvalidArgument("settings.CTRLRUN_NOTIFY_BASE_URL is not set: a mail's link needs the console's "
                              "address as people reach it (e.g. 'https://ops.example.com')")
    path = reverse("admin:ctrlrun_approval_link", args=[quote(delivery.approval_id), link_token(delivery, issued)])
    return config.base_url + path


def body_for(approval: Any, delivery: Any, issued: dt.datetime, config: Settings) -> str:
    action = approval.canonical_action
    lines = [
        f"{reveal(approval.agent)} asks to run {reveal(approval.action)} with these arguments:",
        "",
        dumps(approval.arguments, indent=2, sort_keys=True),
        "",
    ]
    if approval.user:
        lines.append(f"On behalf of user: {reveal(approval.user)}")
    for label, value in (("Resource", action.get("resource")), ("Environment", action.get("environment")),
                         ("Effect key", approval.effect_key)):
        if value:
            lines.append(f"{label}: {reveal(str(value))}")
    lines += [
        f"The policy asks a person (rule {reveal(approval.decision_reason)}). The request expires at "
        f"{when_text(approval.expires_at)}.",
        f"You are told because {basis_text(delivery.basis)}.",
        "",
        f"Open the request in the console, signed in as {reveal(delivery.recipient)}:",
        link_url(delivery, issued, config),
        "",
        f"The link works once, for you only, until {when_text(issued + config.link_lifetime)}. It answers nothing "
        "by itself: the console shows the request and asks you to approve or deny, and to confirm.",
    ]
    return "\n".join(lines) + "\n"


def _send(approval: Any, delivery: Any, issued: dt.datetime, config: Settings) -> None:
    from django.core.mail import EmailMessage

    EmailMessage(subject_for(approval), body_for(approval, delivery, issued, config), config.from_email,
                 [delivery.address]).send()


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]


def _backoff(config: Settings, attempts: int) -> dt.timedelta:
    return min(config.backoff * (2 ** max(attempts - 1, 0)), BACKOFF_MAX)


def attempt(delivery_id: int, config: Settings | None = None) -> str | None:
    """One attempt of a due delivery: ``sent``, ``retry``, ``failed`` or ``dropped``; None when it was
    not due (another process took it, or it finished). Never raises for a mail that cannot be sent."""
    config = config or settings()
    claimed, when = store.notifications.begin_attempt(delivery_id, _backoff(config, 1))
    if claimed is None:
        return None
    hold = _backoff(config, claimed.attempts)
    approval = store.get_approval(claimed.approval_id)
    why_not = _still_to_tell(claimed, approval, config)
    if why_not is not None:
        store.notifications.finish_attempt(claimed.id, claimed.attempts, store.notifications.DROPPED, why_not, None)
        logger.info("mail about %s to %s dropped: %s", claimed.approval_id, reveal(claimed.recipient), why_not)
        return "dropped"
    try:
        _send(approval, claimed, when, config)
    except Exception as exc:  # an SMTP server down or refusing, a bad setting: kept and retried, never raised
        error = _one_line(exc)
        if claimed.attempts >= config.max_attempts:
            store.notifications.finish_attempt(claimed.id, claimed.attempts, store.notifications.FAILED, error, None)
            logger.error("mail about %s to %s failed %d times, giving up: %s", claimed.approval_id,
                         reveal(claimed.recipient), claimed.attempts, error)
            return "failed"
        retry_at = when + hold
        store.notifications.finish_attempt(claimed.id, claimed.attempts, store.notifications.PENDING, error, retry_at)
        logger.warning("mail about %s to %s failed (attempt %d of %d): %s; tried again at %s", claimed.approval_id,
                       reveal(claimed.recipient), claimed.attempts, config.max_attempts, error, when_text(retry_at))
        return "retry"
    store.notifications.finish_attempt(claimed.id, claimed.attempts, store.notifications.SENT, None, None)
    logger.info("mail about %s sent to %s (%s)", claimed.approval_id, reveal(claimed.recipient),
                reveal(claimed.address))
    return "sent"


@dataclass
class Report:
    """What one pass did, by outcome, and how many due rows were skipped unsigned."""

    outcomes: dict[str, int] = field(default_factory=dict)
    unsigned: int = 0

    @property
    def worked(self) -> bool:
        return bool(self.outcomes) or bool(self.unsigned)

    def summary(self) -> str:
        if not self.outcomes and not self.unsigned:
            return "no mail due"
        parts = [f"{n} {what}" for what, n in sorted(self.outcomes.items())]
        if self.unsigned:
            parts.append(f"{self.unsigned} skipped (changed outside ctrlrun: never sent)")
        return ", ".join(parts)


def run_once(limit: int | None = None, approval_id: str | None = None, config: Settings | None = None) -> Report:
    """Try every due delivery once (the oldest first)."""
    config = config or settings()
    due, unsigned = store.notifications.due_deliveries(limit, approval_id)
    if unsigned:
        logger.warning("%d due mail deliveries do not carry ctrlrun's signature (changed outside ctrlrun): "
                       "never sent", unsigned)
    report = Report(unsigned=unsigned)
    for delivery in due:
        outcome = attempt(delivery.id, config)
        if outcome is not None:
            report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
    return report


# --------------------------------------------------------------------------- the link, when opened


@dataclass(frozen=True)
class LinkCheck:
    """What opening a link found: ``ok`` (its use was recorded just now), or why not: ``tampered``,
    ``expired``, ``not_yours``, ``used``. ``delivery`` and ``use`` when known."""

    outcome: str
    approval_id: str
    addressee: str | None = None
    delivery: Any = None
    use: Any = None
    expired_at: dt.datetime | None = None


def check_link(approval_id: str, token: str, username: str, config: Settings | None = None) -> LinkCheck:
    """Open a mail's link as the signed-in ``username``. Records its one use only when it is genuine,
    for this request, unexpired, unused and ``username`` is its addressee; any other opening records
    nothing (a link opened by someone else stays usable by its addressee)."""
    from django.core import signing

    config = config or settings()
    try:
        claim = signing.loads(token, salt=SALT)
        nonce, for_request, addressee, issued = claim["n"], claim["a"], claim["u"], claim["t"]
        issued_at = dt.datetime.fromtimestamp(int(issued), dt.timezone.utc)
    except (signing.BadSignature, KeyError, TypeError, ValueError, OverflowError):
        return LinkCheck("tampered", approval_id)
    delivery = store.notifications.delivery_by_nonce(str(nonce))
    if (for_request != approval_id or delivery is None or not delivery.signature_ok
            or delivery.approval_id != approval_id or delivery.recipient != addressee):
        return LinkCheck("tampered", approval_id)
    if username != addressee:
        logger.warning("the mail link about %s for %s was opened by %s: refused, nothing recorded", approval_id,
                       reveal(addressee), reveal(username))
        return LinkCheck("not_yours", approval_id, addressee, delivery)
    earlier = store.notifications.link_use(delivery.link_nonce)
    if earlier is not None:
        return LinkCheck("used", approval_id, addressee, delivery, earlier)
    expires = issued_at + config.link_lifetime
    if store.now() > expires:
        return LinkCheck("expired", approval_id, addressee, delivery, expired_at=expires)
    first, use = store.notifications.use_link(delivery.link_nonce, approval_id, username)
    return LinkCheck("ok" if first else "used", approval_id, addressee, delivery, use)


# --------------------------------------------------------------------------- the signal receiver


def on_approval_requested(sender: Any, event: Any, **_: Any) -> None:
    """After a request committed: record who is told, and (``CTRLRUN_NOTIFY_AT_ONCE``) try each mail once.
    Nothing raised here reaches the agent's call."""
    try:
        config = settings()
        deliveries = plan(event.approval_id, config)
        if config.at_once:
            for delivery in deliveries:
                if delivery.status == store.notifications.PENDING and delivery.signature_ok:
                    attempt(delivery.id, config)
    except Exception:
        logger.exception("telling the approvers about %s failed (the request stands; `manage.py notify` retries "
                         "what was recorded)", getattr(event, "approval_id", None))


def connect_signal_receiver() -> None:
    from .signals import approval_requested

    approval_requested.connect(on_approval_requested, dispatch_uid="ctrlrun-notify-approvers")


def disconnect_signal_receiver() -> None:
    from .signals import approval_requested

    approval_requested.disconnect(dispatch_uid="ctrlrun-notify-approvers")
