"""``ctrlrun reconcile --loop`` outlives a database outage.

The outage is real: the test runs a PostgreSQL cluster of its own (initdb on a free port, as
the ``postgres`` OS user, since PostgreSQL refuses to run as root), stops it under a running
loop and starts it again. The machine's main server on 5432 is never touched, so the test runs
the same on both passes of the suite (SQLite and ``DATABASE_URL``).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import LEDGER_POLICY, REPO, missing_system_package

pytestmark = pytest.mark.slow

#: Where Debian puts PostgreSQL 15's server binaries (initdb, pg_ctl).
PG_BIN = Path("/usr/lib/postgresql/15/bin")
#: Generous: a loaded CI machine may take many seconds to start a cluster or a Python process.
#: Every wait polls and returns as soon as its condition holds, so this only bounds a failure.
TIMEOUT = 90.0
#: How often a wait looks again.
POLL = 0.1

#: The module the loop imports (--import): the protected function and its reconcile hook, which
#: answers "committed". The function loses its reply (TimeoutError), so each call leaves its
#: effect AMBIGUOUS for the loop to reconcile.
TOOLS = '''\
import ctrlrun


def ask_ledger(effect_key: str) -> str:
    return "committed"


@ctrlrun.protect("ledger.post", effect="post:{entry_id}", reconcile=ask_ledger)
def post(entry_id: str) -> None:
    raise TimeoutError("the reply was lost")
'''

#: One protected call whose reply is lost; prints the state its effect was left in.
MAKE_AMBIGUOUS = '''\
import sys

import ctrlrun
from outage_tools import post

with ctrlrun.context(agent="outage-agent"):
    try:
        post(entry_id=sys.argv[1])
    except TimeoutError:
        pass
from ctrlrun import store  # only now: the protected call above configured Django

print(store.get_effect("post:" + sys.argv[1]).state)
'''


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """A throwaway PostgreSQL cluster in a folder owned by the postgres OS user."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.port = port
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _as_postgres(self, *command: str) -> None:
        result = subprocess.run(["runuser", "-u", "postgres", "--", *command], capture_output=True, text=True,
                                timeout=TIMEOUT)
        assert result.returncode == 0, f"{command[0]} failed: {result.stdout}{result.stderr}"

    def init(self) -> None:
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options,
                          "-l", str(self.folder / "server.log"), "-w", "start")

    def stop(self) -> None:
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "stop", "-m", "fast")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def query(self, sql: str, *params: object) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            return conn.execute(sql, params).fetchall()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A PostgreSQL 15 cluster of this test's own on a free port; always stopped and removed."""
    if not (PG_BIN / "initdb").exists() or os.geteuid() != 0 or not shutil.which("runuser"):
        missing_system_package(f"this test runs a PostgreSQL cluster of its own: it needs {PG_BIN}/initdb (apt-get "
                               f"install postgresql-15) and root, to start it as the postgres user")
    # Not tmp_path: pytest's temporary folders are private to root, and the server runs as postgres.
    folder = Path(tempfile.mkdtemp(prefix="ctrlrun-outage-"))
    shutil.chown(folder, "postgres", "postgres")
    made = Cluster(folder, _free_port())
    try:
        made.init()
        made.start()
        yield made
    finally:
        if made.running():
            subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(made.data),
                            "-w", "stop", "-m", "immediate"], capture_output=True, timeout=TIMEOUT)
        shutil.rmtree(folder, ignore_errors=True)


def _environment(store_url: str) -> dict[str, str]:
    """A standalone process's environment: nothing of the test settings, the cluster as the store."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE",
                        "CTRLRUN_CONFIG", "CTRLRUN_POLICY",
                        # the loop must flush its own lines: a log collector reads them from a pipe
                        "PYTHONUNBUFFERED")}
    env["PYTHONPATH"] = str(REPO)
    env["CTRLRUN_STORE_URL"] = store_url
    return env


#: The two ways to run the command: standalone (``ctrlrun reconcile``, the store from
#: CTRLRUN_STORE_URL) and inside the Django project (``manage.py reconcile``, from DATABASE_URL).
ENTRY_POINTS = ["ctrlrun", "manage.py"]


def _command(entry: str, folder: Path, store_url: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run ``reconcile *args`` through ``entry`` in ``folder``."""
    env = _environment(store_url)
    if entry == "ctrlrun":
        return [sys.executable, "-m", "ctrlrun", "reconcile", *args], env
    env.update(DJANGO_SETTINGS_MODULE="project.settings", DATABASE_URL=store_url,
               CTRLRUN_CONFIG=str(folder / "ctrlrun.yaml"),
               PYTHONPATH=os.pathsep.join([str(REPO), str(folder)]))  # so --import finds the folder's module
    return [sys.executable, str(REPO / "manage.py"), "reconcile", *args], env


def _default_sigint() -> None:
    # A child of a shell's background job inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt; restore the default so that the SIGINT below means Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Loop:
    """``ctrlrun reconcile --loop`` as an OS process, its output collected in files."""

    def __init__(self, entry: str, folder: Path, store_url: str, interval: str = "0.5") -> None:
        self.out_path, self.err_path = folder / "loop.out", folder / "loop.err"
        argv, env = _command(entry, folder, store_url, "--loop", "--interval", interval, "--import", "outage_tools")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=out, stderr=err, text=True,
                                         preexec_fn=_default_sigint)

    def out(self) -> str:
        return self.out_path.read_text()

    def err(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        """Poll until ``condition`` holds; fail, with the loop's output, if it dies or time runs out."""
        deadline = time.monotonic() + TIMEOUT
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"the loop exited ({self.proc.returncode}) while waiting for {what}\n"
                            f"stdout:\n{self.out()}\nstderr:\n{self.err()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}\nstdout:\n{self.out()}\nstderr:\n{self.err()}")
            time.sleep(POLL)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT)


def _make_ambiguous(folder: Path, env: dict[str, str], entry_id: str) -> None:
    result = subprocess.run([sys.executable, "make_ambiguous.py", entry_id], cwd=folder, env=env,
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ambiguous", result.stdout + result.stderr


def _outage_lines(loop: Loop) -> list[str]:
    return [line for line in loop.err().splitlines() if "retrying in" in line]


def _folder(tmp_path: Path) -> None:
    (tmp_path / "ctrlrun.yaml").write_text(LEDGER_POLICY)
    (tmp_path / "outage_tools.py").write_text(TOOLS)
    (tmp_path / "make_ambiguous.py").write_text(MAKE_AMBIGUOUS)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_loop_survives_database_outage(entry: str, cluster: Cluster, tmp_path: Path) -> None:
    """The loop logs a stopped database, waits it out, and reconciles again in the same process."""
    _folder(tmp_path)
    env = _environment(cluster.url)

    def state(key: str) -> str:
        return cluster.query("SELECT state FROM ctrlrun_effectrecord WHERE effect_key = %s", key)[0][0]

    _make_ambiguous(tmp_path, env, "o1")  # also creates the store's tables on the cluster
    loop = Loop(entry, tmp_path, cluster.url)
    try:
        loop.wait_for(lambda: "post:o1  committed" in loop.out(), "the first effect to be reconciled")
        assert state("post:o1") == "committed"

        cluster.stop()
        loop.wait_for(lambda: len(_outage_lines(loop)) >= 2, "the loop to log the outage (twice)")
        assert loop.proc.poll() is None, "the loop died during the outage"
        first = _outage_lines(loop)[0]
        assert "Traceback" not in loop.err()
        # logged with its UTC time by the logger ctrlrun.reconcile (issue 25)
        assert re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z WARNING ctrlrun.reconcile: the store is unavailable", first), first
        assert "retrying in 0.5 s" in first, first  # the first wait (1 s) capped at --interval

        cluster.start()
        loop.wait_for(lambda: "reachable again" in loop.err(), "the loop to log that the store is back")
        _make_ambiguous(tmp_path, env, "o2")
        loop.wait_for(lambda: "post:o2  committed" in loop.out(), "the second effect to be reconciled")
        assert state("post:o2") == "committed"
        assert loop.err().count("reachable again") == 1  # once, not on every healthy pass after

        loop.proc.send_signal(signal.SIGINT)
        returncode = loop.proc.wait(timeout=TIMEOUT)
        assert returncode == 0, loop.err()
        assert loop.out().splitlines()[-1] == "stopped"
        assert "Traceback" not in loop.err()
    finally:
        loop.kill()


def test_loop_backoff_doubles_up_to_interval(cluster: Cluster, tmp_path: Path) -> None:
    """During an outage the loop waits 1 s, then 2 s, then 4 s (--interval), then 4 s again, and recovers."""
    _folder(tmp_path)
    _make_ambiguous(tmp_path, _environment(cluster.url), "o1")
    loop = Loop("ctrlrun", tmp_path, cluster.url, interval="4")
    try:
        loop.wait_for(lambda: "post:o1  committed" in loop.out(), "the first effect to be reconciled")
        cluster.stop()
        loop.wait_for(lambda: len(_outage_lines(loop)) >= 4, "four failed passes in a row")
        waits = [line.split("retrying in ", 1)[1].split(",", 1)[0] for line in _outage_lines(loop)[:4]]
        assert waits == ["1 s", "2 s", "4 s", "4 s"]
        cluster.start()
        loop.wait_for(lambda: "reachable again after" in loop.err(), "the loop to log that the store is back")
        loop.proc.send_signal(signal.SIGINT)
        assert loop.proc.wait(timeout=TIMEOUT) == 0, loop.err()
    finally:
        loop.kill()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_single_pass_still_fails_on_outage(entry: str, cluster: Cluster, tmp_path: Path) -> None:
    """Without --loop, a stopped database is an 'Error: ...' message and a non-zero exit, not a retry."""
    _folder(tmp_path)
    _make_ambiguous(tmp_path, _environment(cluster.url), "o1")
    cluster.stop()
    argv, env = _command(entry, tmp_path, cluster.url, "--import", "outage_tools")
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode != 0
    # Standalone, the check that the store exists already fails (ctrlrun.cli); in the project, the
    # pass's first query does. Either way: one "Error: <message>" line (the driver's two-line message
    # joined), no traceback.
    assert result.stderr.startswith("Error: ") and "Connection refused" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and "retrying" not in result.stderr, result.stderr
    assert result.stdout == ""
