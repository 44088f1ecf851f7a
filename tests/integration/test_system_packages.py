"""Tests that need a system package (Debian's chromium and chromium-driver, faketime, a PostgreSQL
server) are skipped where it is missing, in one line naming what to install, and fail instead when
``CI`` is set, so CI always runs them all.

Each check runs real test files of the suite in a separate pytest process whose PATH holds no
chromium, chromedriver or faketime (or whose PostgreSQL probe points at a closed port), once
without ``CI`` and once with ``CI=true``, and reads the outcome pytest reports.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import BROWSER_NEEDED, FAKETIME_NEEDED, POSTGRES_NEEDED, REPO
from tests.transport_servers import closed_port

pytestmark = pytest.mark.slow

BROWSER_TEST = "tests/e2e/test_console_browser.py::test_auditor_sees_no_buttons"
FAKETIME_TEST = ("tests/integration/test_application_role.py::"
                 "test_a_host_ten_minutes_off_cannot_lapse_a_live_lease")
POSTGRES_TEST = "tests/integration/test_guarantees.py::test_connection_dropped_before_outcome_write"


def run_pytest(tmp_path, *node_ids: str, ci: bool, **extra: str) -> subprocess.CompletedProcess:
    """pytest on the node ids in its own process: PATH is an empty folder and the venv's bin (no
    chromium, chromedriver or faketime), on SQLite (never the test database of this run), ``CI``
    set or not."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "DATABASE_URL", "PYTEST_ADDOPTS") and not k.startswith("PYTEST_XDIST")}
    env.update(PATH=f"{empty}{os.pathsep}{os.path.dirname(sys.executable)}", CTRLRUN_TEST_OUTPUT=str(tmp_path), **extra)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rsfE", "-q",
                           "--basetemp", str(tmp_path / "basetemp"), *node_ids],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def summary(done: subprocess.CompletedProcess) -> str:
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr


def test_the_node_ids_named_here_exist():
    """The checks below name real tests: if one is renamed, this says so instead of a vacuous pass."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           BROWSER_TEST, FAKETIME_TEST, POSTGRES_TEST], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"})
    assert done.returncode == 0 and "3 tests collected" in done.stdout, done.stdout + done.stderr


def test_without_chromium_or_faketime_the_tests_skip_in_one_line_naming_the_package(tmp_path):
    done = run_pytest(tmp_path, BROWSER_TEST, FAKETIME_TEST, ci=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 skipped" in summary(done) and "passed" not in summary(done), done.stdout
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, done.stdout
    assert any(line.endswith(BROWSER_NEEDED) for line in skipped), skipped
    assert any(line.endswith(FAKETIME_NEEDED) for line in skipped), skipped
    assert "apt-get install chromium chromium-driver" in BROWSER_NEEDED
    assert "apt-get install faketime" in FAKETIME_NEEDED


def test_with_ci_set_a_missing_chromium_or_faketime_fails_the_tests(tmp_path):
    done = run_pytest(tmp_path, BROWSER_TEST, FAKETIME_TEST, ci=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "skipped" not in summary(done), done.stdout
    assert "1 failed" in summary(done) and "1 error" in summary(done), done.stdout  # the browser's is its fixture's
    assert BROWSER_NEEDED in done.stdout and FAKETIME_NEEDED in done.stdout
    assert "CI is set, so this is a failure, not a skip" in done.stdout


def test_without_a_postgresql_server_the_scratch_database_tests_skip_and_fail_under_ci(tmp_path):
    probe = {"CTRLRUN_TEST_POSTGRES_ADMIN": f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres"}
    skipped = run_pytest(tmp_path, POSTGRES_TEST, ci=False, **probe)
    assert skipped.returncode == 0 and "1 skipped" in summary(skipped), skipped.stdout + skipped.stderr
    assert any(line.startswith("SKIPPED") and line.endswith(POSTGRES_NEEDED) for line in skipped.stdout.splitlines())
    failed = run_pytest(tmp_path, POSTGRES_TEST, ci=True, **probe)
    assert failed.returncode == 1 and "skipped" not in summary(failed), failed.stdout + failed.stderr
    assert POSTGRES_NEEDED in failed.stdout and "apt-get install postgresql" in POSTGRES_NEEDED
