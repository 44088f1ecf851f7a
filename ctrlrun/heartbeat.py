"""Lease renewal while a protected function runs: a live worker is never swept.

A lease exists so that a *dead* worker's key does not stay held forever: once it lapses, the
sweeper (or the next caller) marks the record ambiguous and a reconcile hook may license a retry.
A worker that is merely *slow* must never meet that fate, so while the function runs, one daemon
thread per process renews the lease of every attempt in flight, from the store's clock. Only a
worker that stops renewing (killed, frozen by SIGSTOP or a VM pause, stuck holding the GIL) lets
its lease lapse. Renewal stops the moment the function returns; a renewal that finds the record
moved (swept while this process was frozen) stops, and says so in the log.

Renewals are cheap and rare: none at all for a call shorter than a third of its lease.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("ctrlrun.heartbeat")

__all__ = ["hold", "release", "Held"]

#: Renew when a third of the lease has gone: two renewals in a row may fail (a database blip, a
#: slow commit) and the lease still has not lapsed when the third succeeds.
RENEW_FRACTION = 3
#: Never renew more often than this, whatever the lease: a renewal is a database write.
MIN_INTERVAL_SECONDS = 0.05
#: After a renewal failed for a database reason, try again this soon (bounded by the interval).
RETRY_SECONDS = 1.0
#: The heap of due renewals is rebuilt without finished calls when it holds more than this many
#: times the calls in flight (plus a little): amortised O(1) per call, memory bounded by those in flight.
COMPACT_FACTOR, COMPACT_SLACK = 4, 256
#: With nothing held, the thread waits this long before it closes its connections (and, with
#: nothing due at all, ends).
IDLE_SECONDS = 60.0


@dataclass(eq=False)
class Held:
    """One attempt in flight whose lease this process renews."""

    call: Any  # store.Call, with its pending events
    attempt: int
    lease: dt.timedelta
    interval: float
    #: Enters the database and clock the call's store phases use (its Control's, or a ``store.using``
    #: block's): a renewal must reach the very record the reservation wrote, on that store's clock.
    scope: Callable[[], AbstractContextManager[Any]] | None = None
    stopped: bool = False
    renewals: int = 0
    order: int = field(default_factory=itertools.count().__next__)


class _Heartbeat:
    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, Held]] = []
        self._live = 0  # entries of _due not stopped
        self._thread: threading.Thread | None = None
        #: When the thread's current wait ends (monotonic); -inf while it is not waiting, since it
        #: then reads the heap before it waits again. A new entry due later needs no wake.
        self._wait_ends = -math.inf
        self.wakes = 0  # notifications sent to the thread (a counter for the tests and the bench)

    def hold(self, call: Any, attempt: int, lease: dt.timedelta,
             scope: Callable[[], AbstractContextManager[Any]] | None = None) -> Held:
        interval = max(lease.total_seconds() / RENEW_FRACTION, MIN_INTERVAL_SECONDS)
        held = Held(call, attempt, lease, interval, scope)
        with self._wake:
            if len(self._due) > COMPACT_FACTOR * self._live + COMPACT_SLACK:
                # Most calls end long before their first renewal: drop their entries now rather
                # than when each comes due, so memory follows the calls in flight, not the call rate.
                self._due = [entry for entry in self._due if not entry[2].stopped]
                heapq.heapify(self._due)
            due = time.monotonic() + interval
            heapq.heappush(self._due, (due, held.order, held))
            self._live += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ctrlrun-heartbeat", daemon=True)
                self._wait_ends = -math.inf
                self._thread.start()
            elif due < self._wait_ends:
                # The thread would wake too late for this renewal. Otherwise it wakes first anyway
                # and reads the heap: the default lease's renewal (100 s) outlasts the idle wait (60 s).
                self._wait_ends = -math.inf
                self.wakes += 1
                self._wake.notify()
        return held

    def release(self, held: Held) -> None:
        with self._wake:
            if not held.stopped:
                held.stopped = True
                self._live -= 1
        held.call = None  # its pending events and arguments are not kept alive by a stopped entry

    def _next(self) -> Held | None:
        """Wait for the next attempt whose renewal is due (None: nothing held for a while)."""
        with self._wake:
            while True:
                while self._due and self._due[0][2].stopped:
                    heapq.heappop(self._due)
                if not self._due:
                    if not self._wait(IDLE_SECONDS):
                        return None
                    continue
                due, _, held = self._due[0]
                delay = due - time.monotonic()
                if delay <= 0:
                    heapq.heappop(self._due)
                    return held
                self._wait(delay)

    def _wait(self, seconds: float) -> bool:
        """Wait on the condition (held) for at most ``seconds``; False when the time ran out."""
        self._wait_ends = time.monotonic() + seconds
        try:
            return self._wake.wait(timeout=seconds)
        finally:
            self._wait_ends = -math.inf

    def _schedule(self, held: Held, delay: float) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + delay, held.order, held))

    def _run(self) -> None:
        from django.db import connections

        from . import store

        while True:
            held = self._next()
            if held is None:
                connections.close_all()  # this thread's connections: idle workers hold none
                with self._wake:
                    if not self._due:
                        self._thread = None
                        return
                continue
            call = held.call  # taken once: a release meanwhile clears it
            if call is None or held.stopped:
                continue
            try:
                with held.scope() if held.scope is not None else contextlib.nullcontext():
                    renewed = store.renew_lease(call, held.attempt, held.lease)
            except Exception as exc:  # the database, or anything else: keep trying while the lease lasts
                if not held.stopped:
                    logger.warning("could not renew the lease of effect %s (attempt %s): %s; trying again",
                                   call.effect_key, held.attempt, exc)
                    self._schedule(held, min(RETRY_SECONDS, held.interval))
                continue
            finally:
                # Renewals are a third of a lease apart: keeping a connection open between them would
                # cost every worker process an idle database session for nothing.
                connections.close_all()
            if renewed:
                held.renewals += 1
                if not held.stopped:
                    self._schedule(held, held.interval)
            elif not held.stopped:
                with self._wake:
                    if not held.stopped:
                        held.stopped = True
                        self._live -= 1
                logger.warning(
                    "effect %s (attempt %s of %s): renewing its lease found the record moved on (its lease lapsed "
                    "while this worker was not running, and it was swept); renewal stops. Whatever the function "
                    "does now is recorded as ambiguous", call.effect_key, held.attempt, call.action.action_id)


_heartbeat = _Heartbeat()


def hold(call: Any, attempt: int, lease: dt.timedelta,
         scope: Callable[[], AbstractContextManager[Any]] | None = None) -> Held:
    """Start renewing ``call``'s lease (its effect key, at ``attempt``) until :func:`release`; each
    renewal runs inside ``scope()`` (the call's database and clock) when given."""
    return _heartbeat.hold(call, attempt, lease, scope)


def release(held: Held) -> None:
    """Stop renewing (the function returned or raised)."""
    _heartbeat.release(held)


def _after_fork() -> None:
    global _heartbeat
    _heartbeat = _Heartbeat()  # the parent's thread does not exist here, nor do its calls


os.register_at_fork(after_in_child=_after_fork)
