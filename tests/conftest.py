"""Fixtures shared by the tests: a policy per test, a principal, a test clock, the stand-in remote
and the refund protected in front of it, a clean reconcile-hook registry, the console's groups,
and a way to run a plain Python script as a separate OS process against the test store, and the
files a paused framework run's processes share.

The plain helpers these are built on live in ``tests/support.py``."""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.support")

from tests.support import (REFUND_POLICY, Remote, evidence_guard, protected_refund,  # noqa: E402
                           script_environment)


@pytest.fixture(autouse=True)
def _evidence_guard_lifted_for_flush(request):
    """Tests on a committed database end with a flush, which the append-only triggers refuse.

    The guard is put back (it may have been lifted by the previous test's teardown) once the
    database is set up, and lifted again just before the flush; everything in between runs
    with the triggers in place, exactly as in production.
    """
    if not {"transactional_db", "live_server", "store_db"} & set(request.fixturenames):
        yield
        return
    from django.db import connection

    request.getfixturevalue("transactional_db")
    evidence_guard().install(connection)
    yield
    from ctrlrun.testing import close_store_threads

    close_store_threads()  # async calls' store threads close their connections before the flush
    evidence_guard().remove(connection)


@pytest.fixture
def use_policy(settings, tmp_path):
    """Write a policy file for this test and make the runtime load it."""
    from ctrlrun.protect import reset_runtime

    def use(text: str = REFUND_POLICY) -> Path:
        path = tmp_path / "ctrlrun.yaml"
        path.write_text(text)
        settings.CTRLRUN_POLICY = str(path)
        reset_runtime()
        return path

    yield use
    reset_runtime()


@pytest.fixture
def store_db(transactional_db, use_policy):
    """A real database (committed transactions, as in production) and the refund policy."""
    use_policy()
    yield


@pytest.fixture
def agent():
    import ctrlrun

    with ctrlrun.context(agent="support-agent") as principal:
        yield principal


@pytest.fixture
def clock():
    """A clock the tests move by hand (``ctrlrun.testing.Clock``), so leases lapse without sleeping."""
    from ctrlrun.testing import Clock, use_clock

    with use_clock(Clock(dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc))) as fake:
        yield fake


@pytest.fixture
def run_script(tmp_path):
    """Run Python source as a separate OS process on the test store; return the CompletedProcess."""

    def run(source: str, policy: str = REFUND_POLICY, timeout: float = 120, **extra_env: str):
        env = script_environment(tmp_path, policy)
        script = tmp_path / "script.py"
        script.write_text(textwrap.dedent(source))
        env.update(extra_env)
        return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=timeout)

    return run


@pytest.fixture
def remote():
    return Remote()


@pytest.fixture
def refund(remote):
    """stripe.refund, keyed by payment, calling the stand-in remote; no reconcile hook."""
    return protected_refund(remote)


@pytest.fixture
def hook_registry():
    """Each test registers its own reconcile hooks (none from another test); the process-wide registry
    is restored afterwards."""
    from ctrlrun.testing import isolated_hooks

    with isolated_hooks() as hooks:
        yield hooks


@pytest.fixture
def console_groups(transactional_db):
    """approvers, resolvers and auditors as ``migrate`` makes them (its post_migrate handler).

    The flush that ends a test on a committed database empties the auth tables, and emits
    post_migrate again, which makes them again; this makes sure of it (the handler does nothing
    for a group that exists)."""
    from django.db import connection

    from ctrlrun.apps import create_console_groups

    create_console_groups(using=connection.alias)


@pytest.fixture
def files(tmp_path, monkeypatch):
    """The files every process of a paused framework run shares (``tests/resumable_agents.py`` reads them
    from the environment): the refund's ledger, what the model was told, the LangGraph checkpoints."""
    paths = {"RESUME_LEDGER": tmp_path / "ledger.txt", "RESUME_SEEN": tmp_path / "seen.jsonl",
             "RESUME_CHECKPOINTS": tmp_path / "checkpoints.db"}
    for name, path in paths.items():
        monkeypatch.setenv(name, str(path))
    return paths
