"""The heartbeat's bookkeeping: memory follows the calls in flight, never the call rate.

A call that ends before its first renewal (nearly every call) leaves nothing behind: a soak of
50,000 calls once showed the renewal queue holding every finished call, with its arguments and
pending events, until its first renewal would have come due (a third of a lease later).
"""
from __future__ import annotations

import datetime as dt
import threading

from ctrlrun import heartbeat


class _Call:
    effect_key = "k"


def test_finished_calls_do_not_pile_up_in_the_renewal_queue() -> None:
    """10,000 short calls under a five-minute lease: the queue stays bounded and keeps no finished call."""
    beat = heartbeat._Heartbeat()
    lease = dt.timedelta(minutes=5)
    live = [beat.hold(_Call(), 1, lease) for _ in range(3)]  # three calls still in flight
    for _ in range(10_000):
        beat.release(beat.hold(_Call(), 1, lease))
    assert beat._live == 3
    assert len(beat._due) <= heartbeat.COMPACT_FACTOR * 3 + heartbeat.COMPACT_SLACK + 1
    assert all(entry[2].call is None for entry in beat._due if entry[2].stopped)
    assert all(held.call is not None and not held.stopped for held in live)
    for held in live:  # else its thread would try to renew these stand-ins a third of a lease later
        beat.release(held)


def test_release_is_idempotent() -> None:
    """Releasing twice counts once."""
    beat = heartbeat._Heartbeat()
    held = beat.hold(_Call(), 1, dt.timedelta(minutes=5))
    beat.release(held)
    beat.release(held)
    assert beat._live == 0 and held.stopped and held.call is None


def _until_waiting(beat: heartbeat._Heartbeat) -> float:
    """Block until the thread sits in its wait; return when that wait ends (monotonic)."""
    for _ in range(10_000):
        with beat._wake:
            if beat._wait_ends > -float("inf"):
                return beat._wait_ends
        threading.Event().wait(0.001)
    raise AssertionError("the heartbeat thread never waited")


def test_a_renewal_due_after_the_current_wait_does_not_wake_the_thread() -> None:
    """The idle thread waits 60 s and the default lease's renewal is due in 100 s: a call does not
    wake it. A renewal due before the thread's wait ends does (else the lease could lapse)."""
    beat = heartbeat._Heartbeat()
    beat.release(beat.hold(_Call(), 1, dt.timedelta(minutes=5)))  # starts the thread: no wake needed
    assert beat.wakes == 0
    _until_waiting(beat)  # on that entry, due in 100 s
    short = beat.hold(_Call(), 1, dt.timedelta(seconds=30))  # due in 10 s: before the wait ends
    assert beat.wakes == 1
    beat.release(short)
    ends = _until_waiting(beat)  # idle (60 s), or on the short entry if it woke before its release
    for _ in range(1_000):  # the hot path: every call holds and releases under the default lease
        held = beat.hold(_Call(), 1, dt.timedelta(minutes=5))
        assert held.interval == 100.0 and max(entry[0] for entry in beat._due) > ends
        beat.release(held)
    assert beat.wakes == 1
