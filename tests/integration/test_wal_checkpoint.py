"""SQLite's WAL checkpoints off the call's path (``ctrlrun/store/checkpoint.py``): real files, real
threads and processes.

The observable: in WAL mode a commit writes only the ``-wal`` file (and the ``-shm`` index); the
database file itself is written by checkpoints alone. So a call during which the database file's
size or mtime changed ran a checkpoint in its COMMIT, and a WAL file's size (it never shrinks: it
starts over from its beginning) is the most it ever held.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from django.db.backends.sqlite3.base import DatabaseWrapper

from ctrlrun import conf
from ctrlrun.checks import check_durations
from ctrlrun.store import checkpoint

from tests.support import REPO, policy_text

pytestmark = pytest.mark.slow

POLICY = policy_text("email")  # email.send, keyed by message, allowed

#: A standalone process on its own store: ``MODE CALLS``; prints one JSON line of what it saw.
SCRIPT = """
import json, os, sys, time
import ctrlrun

ctrlrun.setup()
from django.db import connections
from ctrlrun.store import checkpoint

@ctrlrun.protect("email.send", effect="email:{msg_id}")
def send(msg_id: str) -> str:
    return msg_id

mode, calls = sys.argv[1], int(sys.argv[2])
db = os.environ["CTRLRUN_STATE"]

def written():
    found = os.stat(db)
    return found.st_size, found.st_mtime_ns

def run(tag):
    checkpointing = 0
    for n in range(calls):
        before = written()
        send(msg_id=f"{tag}-{n}")
        checkpointing += written() != before
    return checkpointing

def mine():
    return [{"pid": c.pid, "passes": c.passes, "last": c.last, "interval": c.interval}
            for c in checkpoint.running().values()]

def settled():
    # The thread's own work, with no call running: every frame in the WAL copied into the database.
    for _ in range(3000):
        found = checkpoint.running().get(os.path.abspath(db))
        if found is not None and found.last is not None and found.last[1] == found.last[2] and found.passes > 1:
            return True
        time.sleep(0.01)
    return False

with ctrlrun.context(agent="mailer"):
    send(msg_id="warm")
    raw = connections["default"].connection
    seen = {"autocheckpoint": raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0],
            "page_size": raw.execute("PRAGMA page_size").fetchone()[0], "pid": os.getpid()}
    if mode == "stopped":  # nobody checkpoints in the background: what do the calls do?
        for found in checkpoint.running().values():
            found.stop()
            found.thread.join()
    if mode.startswith("fork"):
        run("parent")
        child = os.fork()
        if child == 0:
            if mode == "fork":
                connections.close_all()  # the parent's connection is the parent's: the child opens its own
            report = {"pid": os.getpid(), "checkpointing": run("child"), "settled": settled(), "mine": mine()}
            with open(db + ".child.json", "w") as out:
                json.dump(report, out)
            os._exit(0)
        _, status = os.waitpid(child, 0)
        seen["child_status"] = status
        seen["child"] = json.load(open(db + ".child.json"))
        send(msg_id="after-the-child")
    else:
        seen["checkpointing"] = run("call")
    seen["settled"] = settled() if mode == "run" else None
    seen["mine"] = mine()
    seen["threads"] = sorted(t.name for t in __import__("threading").enumerate())
    seen["wal_bytes"] = os.path.getsize(db + "-wal")
print(json.dumps(seen))
"""


def _run(tmp_path, mode: str, calls: int, **env: str) -> dict:
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    (tmp_path / "calls.py").write_text(SCRIPT)
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE",
                                "CTRLRUN_CONFIG", "CTRLRUN_SQLITE_CHECKPOINT_SECONDS")}
    environment.update(PYTHONPATH=str(REPO), CTRLRUN_CONFIG=str(tmp_path / "ctrlrun.yaml"),
                       CTRLRUN_STATE=str(tmp_path / "state.db"), **env)
    done = subprocess.run([sys.executable, "calls.py", mode, str(calls)], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def _frames(seen: dict) -> float:
    """The most frames the WAL held: its size over a frame's (a 24-byte header and a page)."""
    return (seen["wal_bytes"] - 32) / (seen["page_size"] + 24)


def test_the_wal_stays_bounded_and_the_thread_copies_it_while_a_process_makes_thousands_of_calls(tmp_path):
    """3,000 back-to-back calls write some 60,000 WAL frames: the WAL never holds more than the backstop
    and a little (a WAL starts over only when a writer begins with every frame copied, so under calls
    with no pause a commit at the backstop restarts it), and with the calls over, the thread alone
    copies every frame into the database."""
    seen = _run(tmp_path, "run", 3000)
    assert seen["autocheckpoint"] == checkpoint.BACKSTOP_PAGES
    assert [m["pid"] for m in seen["mine"]] == [seen["pid"]] and seen["mine"][0]["passes"] > 1
    assert _frames(seen) < checkpoint.BACKSTOP_PAGES + 2000
    assert seen["settled"], "the background thread did not copy the WAL into the database"
    assert "ctrlrun-checkpoint" in seen["threads"]  # still running when the script ended: exit did not wait


def test_no_call_checkpoints_below_the_backstop(tmp_path):
    """With the thread stopped (nobody checkpoints in the background), 300 calls take the WAL well past
    SQLite's default 1000 pages and not one of them writes the database file; with the checkpointer
    turned off (today's behaviour) the same calls do, every thousand pages."""
    (tmp_path / "on").mkdir()
    quiet = _run(tmp_path / "on", "stopped", 300)
    assert quiet["mine"] == [] and quiet["autocheckpoint"] == checkpoint.BACKSTOP_PAGES
    assert _frames(quiet) > 2 * 1000  # SQLite's automatic checkpoint would have run (twice at least)
    assert quiet["checkpointing"] == 0
    (tmp_path / "off").mkdir()
    today = _run(tmp_path / "off", "stopped", 300, CTRLRUN_SQLITE_CHECKPOINT_SECONDS="0")
    assert today["autocheckpoint"] == 1000 and today["mine"] == []
    assert today["checkpointing"] >= 2


def test_turned_off_the_store_checkpoints_as_before(tmp_path):
    """``CTRLRUN_SQLITE_CHECKPOINT_SECONDS=0``: no thread, SQLite's automatic checkpoint in the calls'
    commits, and the WAL as small as that keeps it."""
    seen = _run(tmp_path, "run", 600, CTRLRUN_SQLITE_CHECKPOINT_SECONDS="0")
    assert seen["autocheckpoint"] == 1000 and seen["mine"] == []
    assert "ctrlrun-checkpoint" not in seen["threads"]
    assert seen["checkpointing"] >= 5
    assert _frames(seen) < 1000 + 200  # a checkpoint at every thousand pages, as SQLite does by default


def test_the_interval_is_a_setting(tmp_path):
    seen = _run(tmp_path, "run", 1, CTRLRUN_SQLITE_CHECKPOINT_SECONDS="0.5")
    assert [m["interval"] for m in seen["mine"]] == [0.5] and seen["settled"]


def test_a_bad_interval_is_said_in_one_line_and_calls_go_on_as_without_the_thread(tmp_path):
    seen = _run(tmp_path, "stopped", 3, CTRLRUN_SQLITE_CHECKPOINT_SECONDS="soon")
    assert seen["autocheckpoint"] == 1000 and seen["mine"] == []
    assert seen["stderr"].splitlines() == [
        "CTRLRUN_SQLITE_CHECKPOINT_SECONDS must be a number of seconds (0 turns the background checkpointer off), "
        "got 'soon'; SQLite's automatic checkpoint is left in place"]


@pytest.mark.parametrize("mode", ["fork", "fork-inheriting"])
def test_a_forked_child_calls_and_checkpoints_with_a_thread_of_its_own(tmp_path, mode):
    """The parent's thread does not exist in a child: the child's first connection of its own starts the
    child's checkpointer (or, for a child that goes on with its parent's connection, its first call), its
    calls go on, and the parent's calls after the child too. (The first form failed one run in three
    until fork() waited for a pass in flight: the child's thread never completed one.)"""
    seen = _run(tmp_path, mode, 400)
    child = seen["child"]
    assert seen["child_status"] == 0
    assert [m["pid"] for m in child["mine"]] == [child["pid"]] and child["pid"] != seen["pid"]
    assert child["settled"], json.dumps(seen)
    assert [m["pid"] for m in seen["mine"]] == [seen["pid"]]


def _wal_database(path) -> None:
    with sqlite3.connect(path) as made:
        made.execute("PRAGMA journal_mode=WAL")
        made.execute("CREATE TABLE t (x)")
        made.executemany("INSERT INTO t VALUES (?)", [(n,) for n in range(100)])
    made.close()


def _until(condition, what: str) -> None:
    for _ in range(3000):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(what)


def test_a_database_file_deleted_under_the_thread_is_said_once_and_the_thread_stops(tmp_path, caplog):
    path = str(tmp_path / "gone.db")
    _wal_database(path)
    with caplog.at_level(logging.INFO, logger="ctrlrun.store"):
        found = checkpoint.watch(path, 0.02)
        _until(lambda: found.passes > 0, "the checkpointer never ran")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        found.thread.join(timeout=60)
    assert not found.thread.is_alive() and found.stopped == "the database file was deleted or replaced"
    said = [r for r in caplog.records if "checkpointer" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and path in said[0].getMessage()
    assert not os.path.exists(path), "the thread brought the deleted file back"
    assert path not in checkpoint.running()


def test_a_replaced_file_gets_a_new_checkpointer_from_its_next_connection(tmp_path):
    path = str(tmp_path / "again.db")
    _wal_database(path)
    first = checkpoint.watch(path, 0.02)
    assert checkpoint.watch(path, 0.02) is first  # one per process and file
    os.remove(path)
    first.thread.join(timeout=60)
    _wal_database(path)
    second = checkpoint.watch(path, 0.02)
    assert second is not first and second.alive
    second.stop()
    second.thread.join(timeout=60)


def test_an_in_memory_database_gets_no_checkpointer(db):
    """Tests' in-memory SQLite databases have no file: Django's connection to one starts nothing."""
    before = set(checkpoint.running())
    memory = DatabaseWrapper({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:", "OPTIONS": {},
                              "TIME_ZONE": None, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False,
                              "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False}, alias="memory-probe")
    memory.ensure_connection()
    try:
        assert memory.connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        assert set(checkpoint.running()) == before
    finally:
        memory.close()


@pytest.mark.parametrize("value, read", [(0, None), (0.5, 0.5), (2, 2.0)])
def test_the_setting_reads_seconds_and_zero_is_off(settings, value, read):
    settings.CTRLRUN_SQLITE_CHECKPOINT_SECONDS = value
    assert conf.sqlite_checkpoint_seconds() == read


@pytest.mark.parametrize("value", ["soon", -1, True, float("inf"), float("nan")])
def test_manage_py_check_names_a_bad_interval(settings, value):
    settings.CTRLRUN_SQLITE_CHECKPOINT_SECONDS = value
    [error] = check_durations()
    assert error.id == "ctrlrun.E005"
    assert error.msg == (f"settings.CTRLRUN_SQLITE_CHECKPOINT_SECONDS must be a number of seconds (0 turns the "
                         f"background checkpointer off), got {value!r}")
