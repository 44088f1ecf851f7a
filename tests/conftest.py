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


#: Set by .ci/run for its second pass (DATABASE_URL a PostgreSQL database): only the tests whose outcome
#: can depend on the configured database run again there. See ``pytest_collection_modifyitems``.
SECOND_PASS = "CTRLRUN_TESTS_SECOND_PASS"
#: Tests that never read the configured database unless they ask pytest-django for it: the unit tests
#: (pure logic) and the docs' examples (each runs in a scratch folder on SQLite, DATABASE_URL removed).
_CONFIGURED_DATABASE_UNREAD = ("tests/unit/", "tests/integration/test_docs_examples.py")


def _reads_configured_database(item: pytest.Item) -> bool:
    return "_django_db_helper" in getattr(item, "fixturenames", ()) or item.get_closest_marker("django_db") is not None


def _runs_both_vendors(item: pytest.Item) -> bool:
    """A test parametrized over both databases (its own scratch stores): the first pass ran both halves."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(value in ("sqlite", "postgresql") for value in params.values())


def pytest_collection_modifyitems(config, items):
    """In CI's second pass, deselect what the first pass already ran to the same end: a test that never
    reads the configured database (a unit test, a docs example) or that runs its SQLite and PostgreSQL
    halves itself, unless it uses pytest-django's database (then DATABASE_URL decides what it reads)."""
    import os

    if not os.environ.get(SECOND_PASS):
        return
    repeat = [item for item in items if not _reads_configured_database(item) and (
        item.nodeid.startswith(_CONFIGURED_DATABASE_UNREAD) or _runs_both_vendors(item))]
    if repeat:
        chosen = set(map(id, repeat))
        config.hook.pytest_deselected(items=repeat)
        items[:] = [item for item in items if id(item) not in chosen]


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
