"""Observers: told what ctrlrun wrote, after it is committed, and never able to break a call.

An observer is any object with ``on_event(event)`` and/or ``on_receipt(receipt)``. ``event`` is an
``ObservedEvent`` (``ctrlrun.values.EventView``: its chain position ``seq``, time, type, action, effect
key, approval, data; ``id`` None); ``receipt``
is the receipt document as stored (a dict, ``ctrlrun.receipt/v7``).

When they run: the store hands what a phase appended to the evidence to
``transaction.on_commit``, so observers run after the transaction commits - never inside it,
never for work that rolled back - in the thread that committed, in the order the rows were
written. An observer that raises is logged (``ctrlrun.observers``) and the next one still runs;
the call goes on as if nothing happened. A slow observer slows the call by its own time only.

Who is told: the observers of the ``Control`` whose call wrote (``Control(observers=[...])``),
then those registered for the whole process with ``register()``, then Django's signals
(``ctrlrun.signals``) - so the console's and the commands' writes (a person approving, resolving)
reach process observers and signal receivers too.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from .values import EventView

logger = logging.getLogger("ctrlrun.observers")

__all__ = ["Observer", "ObservedEvent", "register", "unregister", "observing", "deliver", "wanted"]


class Observer(Protocol):
    def on_event(self, event: ObservedEvent) -> None: ...

    def on_receipt(self, receipt: dict[str, Any]) -> None: ...


#: What an observer is told of one event: the store's own event value (one definition).
ObservedEvent = EventView


_process: list[Any] = []
_scoped: ContextVar[tuple[Any, ...]] = ContextVar("ctrlrun_observers", default=())


def register(observer: Any) -> None:
    """Tell ``observer`` about every write of this process, whichever Control (or person) made it."""
    if not (callable(getattr(observer, "on_event", None)) or callable(getattr(observer, "on_receipt", None))):
        from .errors import InvalidArgument

        raise InvalidArgument(f"{observer!r} has neither on_event() nor on_receipt()")
    if observer not in _process:
        _process.append(observer)


def unregister(observer: Any) -> None:
    if observer in _process:
        _process.remove(observer)


@contextmanager
def observing(observers: Sequence[Any]) -> Iterator[None]:
    """The running Control's observers, for the writes inside the block."""
    token = _scoped.set(tuple(observers))
    try:
        yield
    finally:
        _scoped.reset(token)


def _signals_listening() -> bool:
    from . import signals

    return signals.listening()


def wanted() -> tuple[Any, ...] | None:
    """Who should hear of a write made now, or None when nobody listens (the store then does nothing)."""
    chosen = (*_scoped.get(), *_process)
    if chosen or _signals_listening():
        return chosen
    return None


def deliver(observers: Sequence[Any], events: Sequence[ObservedEvent], receipts: Sequence[dict[str, Any]]) -> None:
    """Tell each observer, then the signals; nothing raised here reaches the caller."""
    for observer in observers:
        _tell(observer, "on_event", events)
        _tell(observer, "on_receipt", receipts)
    try:
        from . import signals

        signals.send(events, receipts)
    except Exception:
        logger.exception("a ctrlrun signal receiver failed")


def _tell(observer: Any, method: str, items: Sequence[Any]) -> None:
    handler = getattr(observer, method, None)
    if handler is None:
        return
    for item in items:
        try:
            handler(item)
        except Exception:
            logger.exception("ctrlrun observer %r failed in %s", observer, method)


def after_commit(alias: str, events: Sequence[ObservedEvent], receipts: Sequence[dict[str, Any]]) -> None:
    """Called by the store inside a phase with what it appended: the events (with their ``seq``) and the
    receipt documents. Delivered once the phase's transaction commits; nothing at all when nobody listens."""
    chosen = wanted()
    if chosen is None or not (events or receipts):
        return
    from django.db import transaction

    observed = list(events)
    documents = [dict(doc) for doc in receipts]
    transaction.on_commit(lambda: deliver(chosen, observed, documents), using=alias)
