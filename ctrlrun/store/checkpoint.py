"""SQLite's WAL checkpoints off the call's path: one background thread per process and database file.

In WAL mode a commit appends its pages to the ``-wal`` file; a *checkpoint* copies them back into the
database so that the WAL can start over. SQLite's own (automatic) checkpoint runs inside the COMMIT
that leaves the WAL at ``wal_autocheckpoint`` pages or more (1000 by default): every hundred-odd
allowed calls, one call pays for copying the WAL into the database, with its fsyncs.

Here a daemon thread holding a connection of its own (never Django's) runs ``PRAGMA
wal_checkpoint(PASSIVE)``, which neither waits for nor blocks a reader or a writer, every
``interval`` seconds (``CTRLRUN_SQLITE_CHECKPOINT_SECONDS``), and sooner while the WAL grows by more
than ``TARGET_FRAMES`` between two passes. The store's connections raise the automatic checkpoint to
``BACKSTOP_PAGES``: a call checkpoints only if the thread fell that far behind.

- Started by :func:`watch` when Django opens a connection to a database file in WAL mode
  (``store.sqlite.connected``); an in-memory database has no file and no WAL, and gets none.
- A forked child has none of its parent's threads: the registry starts empty there, and the
  child's first connection of its own starts the child's checkpointer, or, for a child that goes
  on with the Django connection it inherited, its first phase on that store (``inherited``). The
  parent's sqlite3 connections are kept, never used nor closed, in the child. ``fork()`` waits for a pass in flight
  (``_passing``): a child that inherited SQLite's state mid-checkpoint would find the file's
  checkpoint lock held, in its own process, by a thread that does not exist there, forever.
- A database file deleted or replaced under the thread: said once in the log; the thread stops
  (a connection to the new file starts a new one).
- A daemon: process exit never waits for it, and a checkpoint cut short is safe (the next
  checkpoint, or the next opener's recovery, completes it).
"""
from __future__ import annotations

import atexit
import logging
import os
import sqlite3
import threading
import time
from urllib.parse import quote

logger = logging.getLogger("ctrlrun.store")

#: The store's connections run SQLite's automatic checkpoint only past this many WAL pages (40 MB at
#: 4 KiB pages): a backstop for a checkpointer that fell behind, never the normal path.
BACKSTOP_PAGES = 10_000
#: The next pass comes when the WAL should have grown by this many frames (SQLite's own default
#: threshold) at the rate the last two passes saw, or after the interval, whichever is sooner.
TARGET_FRAMES = 1000
#: The shortest wait between two passes, however fast the WAL grows.
MIN_DELAY_SECONDS = 0.02


def _identity(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class Checkpointer:
    """The thread that checkpoints one database file for this process, and what it has done."""

    def __init__(self, path: str, interval: float) -> None:
        self.path = path
        self.interval = interval
        self.pid = os.getpid()
        self.passes = 0  # checkpoints run
        #: The last pass's answer: (busy, frames in the WAL, frames of them now in the database).
        self.last: tuple[int, int, int] | None = None
        self.stopped: str | None = None  # why the thread ended, or None while it runs
        self.connection: sqlite3.Connection | None = None  # kept here: a forked child must not close it
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ctrlrun-checkpoint", daemon=True)

    @property
    def alive(self) -> bool:
        return self.stopped is None and self.thread.is_alive()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to end after its current pass (tests)."""
        self._stop.set()

    def _end(self, why: str, *, warn: bool) -> None:
        self.stopped = why
        if not _exiting:  # at exit the log's streams may be closed already (a test run's database removed)
            (logger.warning if warn else logger.info)("the WAL checkpointer of %s stops: %s", self.path, why)

    def _run(self) -> None:
        identity = _identity(self.path)
        try:
            # mode=rw: never create a file (a deleted store is not brought back empty by this thread).
            with _passing:
                self.connection = sqlite3.connect(f"file:{quote(self.path)}?mode=rw", uri=True,
                                                  isolation_level=None, check_same_thread=False)
                self.connection.execute("PRAGMA synchronous=NORMAL")  # the store's: fsync at checkpoints only
        except sqlite3.Error as exc:
            self._end(f"it could not open the file ({exc}); SQLite's automatic checkpoint is left to do it",
                      warn=True)
            return
        delay, last_frames, last_time, failing = MIN_DELAY_SECONDS, 0, time.monotonic(), False
        try:
            while not self._stop.wait(delay):
                if identity is None or _identity(self.path) != identity:
                    # Said at INFO: the store's own next statement fails loudly on a file that is gone,
                    # and a test run removes its database while this thread is still alive.
                    self._end("the database file was deleted or replaced", warn=False)
                    return
                try:
                    with _passing:
                        busy, frames, copied = self.connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:
                    if not failing:  # said once, until a pass succeeds again
                        logger.warning("a WAL checkpoint of %s failed: %s; trying again", self.path, exc)
                    failing, delay = True, self.interval
                    continue
                failing = False
                if frames < 0:
                    if busy:  # another connection is checkpointing this file right now: its work is done
                        continue
                    self._end("the database is no longer in WAL mode", warn=False)
                    return
                self.passes += 1
                self.last = (busy, frames, copied)
                now = time.monotonic()
                new = frames - last_frames if frames >= last_frames else frames  # the WAL restarted meanwhile
                # Wait as long as the WAL takes to grow by TARGET_FRAMES at the rate just seen.
                delay = min(self.interval, max(MIN_DELAY_SECONDS, (now - last_time) * TARGET_FRAMES / max(new, 1)))
                if frames >= BACKSTOP_PAGES:
                    # Writers never paused long enough for the WAL to start over (only a writer that
                    # begins with every frame copied restarts it): a commit's own checkpoint will, now
                    # that it has little left to copy. A pass of ours would make it find the file busy.
                    delay = self.interval
                last_frames, last_time = frames, now
            self._end("asked to stop", warn=False)
        finally:
            if self.connection is not None and os.getpid() == self.pid:
                with _passing:
                    self.connection.close()


_lock = threading.Lock()
#: Held by a thread while its connection is inside SQLite (open, a pass, close), and by ``fork()``:
#: a child must not inherit SQLite's bookkeeping in the middle of a checkpoint (its copy of the
#: checkpoint lock would be held forever by a thread that does not exist there).
_passing = threading.Lock()
_running: dict[str, Checkpointer] = {}
#: A forked child's copy of its parent's checkpointers: their threads do not exist here, and their
#: connections are never closed here (that could drop locks SQLite believes this process holds).
_parents: list[Checkpointer] = []


#: The files a forked child's parent checkpointed, until the child watches them itself: a child that
#: goes on with a connection it inherited opens none of its own, so its first phase on that store
#: starts its thread (``base.write_phase``). Empty (the check is one truth test) everywhere else.
inherited: set[str] = set()


def claim(path: str) -> bool:
    """True once, in a forked child, for a file its parent checkpointed (and the child not yet)."""
    key = os.path.abspath(path)
    if key in inherited:
        inherited.discard(key)
        return True
    return False


def watch(path: str, interval: float) -> Checkpointer:
    """This process's checkpointer of the database file at ``path``, started if none runs."""
    key = os.path.abspath(path)
    inherited.discard(key)
    with _lock:
        current = _running.get(key)
        if current is not None and current.alive:
            return current
        checkpointer = _running[key] = Checkpointer(key, interval)
        checkpointer.start()
    return checkpointer


def running() -> dict[str, Checkpointer]:
    """This process's checkpointers by database path (tests, benches)."""
    with _lock:
        return {path: found for path, found in _running.items() if found.alive}


_exiting = False


def _at_exit() -> None:
    global _exiting
    _exiting = True
    for found in list(_running.values()):
        found.stop()


atexit.register(_at_exit)


def _after_fork() -> None:
    global _lock, _passing
    _lock = threading.Lock()  # another thread may have held it at the fork
    _passing = threading.Lock()
    _parents.extend(_running.values())
    inherited.update(path for path, found in _running.items() if found.stopped is None)
    _running.clear()


os.register_at_fork(before=lambda: _passing.acquire(), after_in_parent=lambda: _passing.release(),
                    after_in_child=_after_fork)
