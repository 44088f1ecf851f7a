"""Sinks: observers that ship the evidence somewhere else once it is committed (spec §A2).

``EventSink`` is the reference's name for an observer (``ctrlrun.observers``): an object with
``on_event(event)`` and ``on_receipt(receipt)``. A sink is given to ``Control(observers=[...])`` or
registered for the whole process with ``ctrlrun.observers.register``; it hears each write after its
transaction commits, in order, and nothing it raises reaches the agent's call.

``JSONLEventSink(directory)`` appends one JSON line per record to ``<directory>/receipts.jsonl`` and
``<directory>/events.jsonl`` (each opened, appended to and closed per write, so rotation by
``logrotate``'s create mode or a ``mv`` needs no signal):

- a receipt line is the stored document, in its key order (not sorted);
- an event line is ``{event_id, ts, type, action_id, effect_key, approval_id, data}``; ``event_id``
  is the event's position in the store's event chain (its ``seq``);
- each line is valid JSON on one line, with every invisible or direction-changing character written
  as a JSON escape (``\\u202e``; ``ctrlrun.display``), so ``tail`` or ``less`` shows what is there;
- a write that fails (a full disk, a read-only volume, a file removed under it) is logged on
  ``ctrlrun.sinks`` and never fails the call. What a partial write left in the file is cut off again
  (no torn line); the lines not written wait, in order, and go out first on the next write or on
  ``flush()`` (up to ``max_pending`` of them: beyond, the newest are dropped, counted and logged -
  the store keeps every record, and ``receipts --json`` reads them back).

Processes writing the same files take an exclusive ``flock`` per write, so lines never interleave.
Standard library only.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from .display import dumps
from .times import evidence_time

logger = logging.getLogger("ctrlrun.sinks")

__all__ = ["EventSink", "JSONLEventSink", "event_line", "receipt_line", "RECEIPTS_FILE", "EVENTS_FILE"]

RECEIPTS_FILE = "receipts.jsonl"
EVENTS_FILE = "events.jsonl"
#: How many unwritten lines a JSONL sink keeps for its next write before it drops the newest.
DEFAULT_MAX_PENDING = 100_000


class EventSink(Protocol):
    """What a sink implements: both methods, each called after the write commits."""

    def on_event(self, event: Any) -> None: ...

    def on_receipt(self, receipt: dict[str, Any]) -> None: ...


def receipt_line(receipt: dict[str, Any]) -> str:
    """One receipt as a JSONL line (without its newline): key order kept, compact, hidden characters escaped."""
    return dumps(receipt, separators=(",", ":"))


def event_line(event: Any) -> str:
    """One observed event as a JSONL line: ``{event_id, ts, type, action_id, effect_key, approval_id, data}``."""
    document = {
        "event_id": event.seq if event.seq is not None else event.id,
        "ts": evidence_time(event.ts),
        "type": event.type,
        "action_id": event.action_id,
        "effect_key": event.effect_key,
        "approval_id": event.approval_id,
        "data": event.data,
    }
    return dumps(document, separators=(",", ":"))


class _Appender:
    """One JSONL file: lines appended whole under a lock, or kept for the next try."""

    def __init__(self, path: Path, max_pending: int) -> None:
        self.path = path
        self.max_pending = max_pending
        self.pending: deque[str] = deque()
        self.dropped = 0
        self._lock = threading.Lock()

    def append(self, line: str | None) -> bool:
        """Write what waits, then ``line``; True when nothing is left waiting."""
        with self._lock:
            lines = [*self.pending, *([] if line is None else [line])]
            if not lines:
                return True
            try:
                self._write("".join(f"{text}\n" for text in lines).encode("utf-8"))
            except (OSError, ValueError) as exc:  # ValueError: a path with a NUL byte
                if line is not None:
                    self._keep(line)
                logger.error("could not append to %s (%s: %s); %d lines wait for the next write",
                             self.path, type(exc).__name__, exc, len(self.pending))
                return False
            self.pending.clear()
            return True

    def _keep(self, line: str) -> None:
        if len(self.pending) < self.max_pending:
            self.pending.append(line)
            return
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            logger.error("%s: %d lines already wait to be written; %d dropped so far (the store still holds "
                         "every record)", self.path, len(self.pending), self.dropped)

    def _write(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            except OSError:
                _cut(fd, start)  # no torn line left behind for the next writer
                raise
        finally:
            os.close(fd)  # releases the lock


def _cut(fd: int, size: int) -> None:
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    except OSError as exc:  # a device (or a file another process holds) cannot be cut: say so
        logger.error("could not remove a partly written line (%s: %s)", type(exc).__name__, exc)


class JSONLEventSink:
    """Append each receipt and event to ``receipts.jsonl`` / ``events.jsonl`` in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        from .errors import InvalidArgument

        if max_pending < 0:
            raise InvalidArgument(f"JSONLEventSink(max_pending={max_pending}): must be 0 or more")
        self.directory = Path(directory)
        self._receipts = _Appender(self.directory / RECEIPTS_FILE, max_pending)
        self._events = _Appender(self.directory / EVENTS_FILE, max_pending)

    @property
    def receipts_path(self) -> Path:
        return self._receipts.path

    @property
    def events_path(self) -> Path:
        return self._events.path

    @property
    def pending(self) -> int:
        """How many lines wait for a write that can succeed."""
        return len(self._receipts.pending) + len(self._events.pending)

    @property
    def dropped(self) -> int:
        """How many lines were dropped because ``max_pending`` were already waiting."""
        return self._receipts.dropped + self._events.dropped

    def on_event(self, event: Any) -> None:
        self._events.append(_safely(event_line, event))

    def on_receipt(self, receipt: dict[str, Any]) -> None:
        self._receipts.append(_safely(receipt_line, receipt))

    def flush(self) -> bool:
        """Try again to write what waits; True when nothing is left waiting."""
        receipts = self._receipts.append(None)
        events = self._events.append(None)
        return receipts and events

    def __repr__(self) -> str:
        return f"JSONLEventSink({str(self.directory)!r})"


def _safely(render: Any, record: Any) -> str | None:
    try:
        return render(record)
    except Exception:  # a value JSON cannot hold: the store has it; the file does not get a broken line
        logger.exception("could not render a record as JSON for the JSONL sink")
        return None
