"""Helpers for your own test suite: a clock you move, approvers you script, hooks kept apart, and
assertions about what really happened, read from the store.

    from ctrlrun.testing import Clock, ScriptedApprovalProvider, assert_ran_once, isolated_hooks

    def test_refund_runs_once(...):
        control = ctrlrun.Control(approvals=ScriptedApprovalProvider(["grant"]), clock=Clock())
        ...
        assert_ran_once("refund:txn_9")

Everything here uses the real store: the assertions read the effect record, its receipts and its
events, the same evidence ``ctrlrun receipts`` and the console show, so a test cannot pass on
something the store does not say. Use them on a database that commits (pytest-django's
``transactional_db``), since ctrlrun's phases are durable transactions.
"""
from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

from .approvals import ScriptedApprovalProvider
from .errors import InvalidArgument

__all__ = ["Clock", "ScriptedApprovalProvider", "use_clock", "isolated_hooks", "assert_ran_once",
           "assert_never_ran", "effect_history", "close_store_threads"]

#: Where a fresh Clock starts: a fixed instant, so tests that print times are reproducible.
DEFAULT_START = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


class Clock:
    """A clock that moves only when told: ``Control(clock=Clock())`` or ``use_clock(Clock())``.

    Leases lapse and approvals expire by ``advance(minutes=6)``, without sleeping.
    """

    def __init__(self, start: dt.datetime = DEFAULT_START) -> None:
        if start.tzinfo is None:
            raise InvalidArgument("Clock(start=...) must be an aware datetime (e.g. tzinfo=datetime.timezone.utc)")
        self.now = start.astimezone(dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **delta: float) -> dt.datetime:
        """Move forward by ``datetime.timedelta(**delta)``; returns the new time."""
        step = dt.timedelta(**delta)
        if step < dt.timedelta(0):
            raise InvalidArgument("a ctrlrun test clock only moves forward (leases and chains assume it)")
        self.now += step
        return self.now


@contextlib.contextmanager
def use_clock(clock: Any) -> Iterator[Any]:
    """Inside the block, every store call of this process uses ``clock`` (then the real one again)."""
    from . import conf

    conf.set_clock(clock)
    try:
        yield clock
    finally:
        conf.set_clock(None)


@contextlib.contextmanager
def isolated_hooks() -> Iterator[dict[str, Any]]:
    """Inside the block the default reconcile-hook registry starts empty (hooks your test registers
    by decorating functions stay its own); the registry is restored afterwards."""
    from .control import PROCESS_HOOKS as _hooks

    saved = dict(_hooks)
    _hooks.clear()
    try:
        yield _hooks
    finally:
        _hooks.clear()
        _hooks.update(saved)


def effect_history(effect_key: str) -> dict[str, Any]:
    """What the store says happened under ``effect_key``: its state, attempts, receipts' results,
    and how many attempts started executing."""
    from . import store

    ctrlrun_setup()
    record = store.get_effect(effect_key)
    events = store.events_for_effect(effect_key)
    return {
        "state": record.state if record else None,
        "attempt": record.attempt if record else 0,
        "results": [r.result for r in store.receipts_for_effect(effect_key)],
        "started": sum(1 for e in events if e.type == "EXECUTION_STARTED"),
        "not_executed": sum(1 for e in events if e.type == "EXECUTION_FAILED"),
    }


def assert_ran_once(effect_key: str) -> None:
    """The effect under ``effect_key`` happened exactly once, by the store's evidence: the record is
    committed, one receipt says committed, and every other attempt that started ended ``failed``
    (``NotExecuted``: it did not happen)."""
    history = effect_history(effect_key)
    ran = history["started"] - history["not_executed"]
    if history["state"] != "committed" or history["results"].count("committed") != 1 or ran != 1:
        raise AssertionError(f"{effect_key!r} did not run exactly once: {_said(history)}")


def assert_never_ran(effect_key: str) -> None:
    """Nothing under ``effect_key`` ran: no attempt started, or every one that did ended ``failed``."""
    history = effect_history(effect_key)
    if history["state"] not in (None, "failed") or history["started"] != history["not_executed"]:
        raise AssertionError(f"{effect_key!r} may have run: {_said(history)}")


def _said(history: dict[str, Any]) -> str:
    return (f"the record is {history['state'] or 'absent'} at attempt {history['attempt']}, "
            f"{history['started']} attempt(s) started, {history['not_executed']} ended not executed, "
            f"receipts: {', '.join(history['results']) or 'none'}")


def close_store_threads() -> None:
    """Stop the threads that run async calls' store phases, closing their database connections
    (call it before your test database is flushed or dropped; they start again on demand)."""
    from .kernel import drive

    drive.shutdown()


def ctrlrun_setup() -> None:
    from . import setup

    setup()
