"""Django signals for what ctrlrun records, sent after the write commits (``ctrlrun.observers``).

Connect a receiver the usual way::

    from django.dispatch import receiver
    from ctrlrun import store
    from ctrlrun.signals import approval_requested

    @receiver(approval_requested)
    def tell_the_approvers(sender, event, **kwargs):
        request = store.get_approval(event.approval_id)  # the event has ids and data {action_hash, expires_at}
        ...  # request.action, request.arguments, request.agent

Every signal is sent with ``sender`` = the event type (a str) and ``event`` = the
``ObservedEvent``; ``receipt_written`` with ``receipt`` = the receipt document instead. A receiver
that raises is logged and the others still run (``send_robust``); it cannot fail the call.

- ``event_recorded``: every event;
- ``action_denied``: ``ACTION_DENIED`` (the policy said no, or a refusal before running);
- ``approval_requested``: ``APPROVAL_REQUESTED`` (a person is needed);
- ``approval_answered``: ``APPROVAL_GRANTED`` / ``APPROVAL_DENIED`` (``event.type`` says which);
- ``effect_ambiguous``: ``EXECUTION_AMBIGUOUS`` (a reply was lost, or a worker died);
- ``effect_resolved``: ``EFFECT_RESOLVED`` (a person said committed/failed) and
  ``RECONCILIATION_RESOLVED`` (a hook's answer moved the record; ``event.data`` has the outcome);
- ``receipt_written``: every receipt.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("ctrlrun.observers")

__all__ = ["event_recorded", "action_denied", "approval_requested", "approval_answered", "effect_ambiguous",
           "effect_resolved", "receipt_written"]

event_recorded = Signal()
action_denied = Signal()
approval_requested = Signal()
approval_answered = Signal()
effect_ambiguous = Signal()
effect_resolved = Signal()
receipt_written = Signal()

_BY_TYPE: dict[str, Signal] = {
    "ACTION_DENIED": action_denied,
    "APPROVAL_REQUESTED": approval_requested,
    "APPROVAL_GRANTED": approval_answered,
    "APPROVAL_DENIED": approval_answered,
    "EXECUTION_AMBIGUOUS": effect_ambiguous,
    "EFFECT_RESOLVED": effect_resolved,
    "RECONCILIATION_RESOLVED": effect_resolved,
}
_ALL = (event_recorded, receipt_written, *dict.fromkeys(_BY_TYPE.values()))


def listening() -> bool:
    return any(signal.receivers for signal in _ALL)


def _send(signal: Signal, sender: str, **named: Any) -> None:
    if not signal.receivers:
        return
    for receiver, result in signal.send_robust(sender=sender, **named):
        if isinstance(result, Exception):
            logger.error("ctrlrun signal receiver %r failed: %s: %s", receiver, type(result).__name__, result,
                         exc_info=result)


def send(events: Sequence[Any], receipts: Sequence[dict[str, Any]]) -> None:
    for event in events:
        _send(event_recorded, event.type, event=event)
        specific = _BY_TYPE.get(event.type)
        if specific is not None:
            _send(specific, event.type, event=event)
    for receipt in receipts:
        _send(receipt_written, "receipt", receipt=receipt)
