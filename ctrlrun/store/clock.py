"""Clock skew (spec §F9): a host whose clock disagrees with the database's, named in the evidence.

On PostgreSQL the store's clock is the database server's ``now()``: leases, expiries and every time
the evidence carries come from it, so hosts whose clocks disagree still agree on a lease. What a
host's own clock still decides (a process's timeouts, the times in its logs, a webhook's replay
window) goes wrong quietly when that clock drifts. So after a phase commits, a process compares its
clock with the database's, at most once per ``CTRLRUN_CLOCK_SKEW_INTERVAL_SECONDS``; when they
disagree by more than ``CTRLRUN_CLOCK_SKEW_THRESHOLD_SECONDS`` (beyond the measurement's own
uncertainty, half the round trip) it appends ``CLOCK_SKEW_DETECTED`` to the event chain, once per
episode: again only after a measurement back within the threshold has ended the episode.

It decides nothing and never fails a call: a measurement or a record that cannot be made is logged
and tried again at the next interval. On SQLite the store's clock *is* the host's (every process of
a store runs on the host that holds its file), so there is nothing to compare and nothing is
recorded; a test clock (``conf.set_clock``) is not measured either.
"""
from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from .. import conf
from ..receipts import event_time
from ..states import EventType

logger = logging.getLogger("ctrlrun.clock")

__all__ = ["Skew", "measure", "after_phase", "reset"]

#: The values of ``trigger``: the first measurement of a process (its store opened), or a later one.
OPEN, INTERVAL = "open", "interval"


@dataclass(frozen=True)
class Skew:
    """One measurement: the host's clock minus the database's (positive: the host is ahead), and
    the uncertainty of the measurement (half the round trip)."""

    skew: dt.timedelta
    bound: dt.timedelta
    threshold: dt.timedelta
    trigger: str
    measured_at: dt.datetime  # the database's time

    @property
    def exceeded(self) -> bool:
        return abs(self.skew) - self.bound > self.threshold

    def event_data(self) -> dict[str, Any]:
        micros = lambda delta: int(delta / dt.timedelta(microseconds=1))  # noqa: E731
        return {"skew_us": abs(micros(self.skew)), "bound_us": micros(self.bound),
                "threshold_us": micros(self.threshold),
                "direction": "ahead" if self.skew > dt.timedelta(0) else "behind",
                "trigger": self.trigger, "measured_at": event_time(self.measured_at), "host": socket.gethostname()}


class _Episode:
    """Per process: when the next measurement is due, whether one was made, whether the last exceeded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.due = 0.0  # time.monotonic()
        self.measured = False
        self.exceeded = False


_episode = _Episode()


def reset() -> None:
    """Forget this process's measurements (tests; a forked child starts its own episode)."""
    global _episode
    _episode = _Episode()


def _host_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def measure(connection: Any, trigger: str = INTERVAL) -> Skew:
    """Compare this host's clock with the database's, now (PostgreSQL)."""
    with connection.cursor() as cursor:
        before = _host_now()
        cursor.execute("SELECT clock_timestamp()")
        database = cursor.fetchone()[0]
        after = _host_now()
    if database.tzinfo is None:
        database = database.replace(tzinfo=dt.timezone.utc)
    middle = before + (after - before) / 2
    return Skew(middle - database, (after - before) / 2, conf.clock_skew_threshold(), trigger, database)


def _record(skew: Skew) -> None:
    from .base import write_phase
    from .chain import event_row, seal

    with write_phase() as when:
        seal([event_row(EventType.CLOCK_SKEW_DETECTED, None, None, skew.event_data(), when)], [], when)


def after_phase(connection: Any, database: Any) -> None:
    """Called by ``base.write_phase`` once its transaction committed: measure when one is due, and
    record a new episode's first exceeded measurement. Never raises."""
    if not database.CLOCK_IN_DATABASE or conf.clock_overridden():
        return
    episode = _episode
    if time.monotonic() < episode.due or not episode.lock.acquire(blocking=False):
        return  # not due, or another thread of this process is measuring
    try:
        try:
            episode.due = time.monotonic() + conf.clock_skew_interval().total_seconds()
            skew = measure(connection, INTERVAL if episode.measured else OPEN)
            episode.measured = True
            if not skew.exceeded:
                episode.exceeded = False
                return
            if episode.exceeded:
                return  # this episode is recorded already
            _record(skew)
            episode.exceeded = True
            logger.warning("this host's clock is %s the database's by %.3f s (threshold %.3f s): recorded "
                           "CLOCK_SKEW_DETECTED", skew.event_data()["direction"], abs(skew.skew.total_seconds()),
                           skew.threshold.total_seconds())
        except Exception as exc:  # noqa: BLE001 - reported, never the call's failure
            logger.warning("ctrlrun could not compare this host's clock with the database's (%s: %s); it tries "
                           "again at the next interval", type(exc).__name__, " ".join(str(exc).split()))
    finally:
        episode.lock.release()
