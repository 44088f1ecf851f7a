"""What the machine must have (Chromium, faketime, a PostgreSQL server): one line naming the
package when it is missing, a failure instead under CI."""
from __future__ import annotations

import os

import pytest





# --------------------------------------------------------------------------- what the machine must have


def in_ci() -> bool:
    """CI runs every test: there, a missing system package is a failure, never a skip (.ci/run sets CI=true)."""
    return bool(os.environ.get("CI", "").strip())


def missing_system_package(reason: str) -> None:
    """Skip a test whose system package is missing, in one line naming what to install; fail it in CI."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


#: The console's browser tests: Debian's Chromium and its ChromeDriver, found on PATH.
BROWSER = ("chromium", "chromedriver")
BROWSER_NEEDED = ("the console's browser tests need Debian's chromium and chromium-driver: "
                  "apt-get install chromium chromium-driver")
FAKETIME_NEEDED = "this test runs a process under a skewed clock: apt-get install faketime"
#: The PostgreSQL server the tests' scratch databases are made on (trust auth, user postgres).
POSTGRES_ADMIN_URL = os.environ.get("CTRLRUN_TEST_POSTGRES_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
POSTGRES_NEEDED = ("this test makes scratch databases on a PostgreSQL server at 127.0.0.1:5432 (user postgres, trust "
                   "auth): apt-get install postgresql, then start it (.ci/run does)")


def require_browser() -> tuple[str, str]:
    """The paths of ``chromium`` and ``chromedriver`` on PATH; else a skip (a failure in CI)."""
    import shutil

    found = tuple(shutil.which(program) for program in BROWSER)
    if not all(found):
        missing_system_package(BROWSER_NEEDED)
    return found  # type: ignore[return-value]


def require_faketime() -> str:
    import shutil

    found = shutil.which("faketime")
    if not found:
        missing_system_package(FAKETIME_NEEDED)
    return found  # type: ignore[return-value]


def require_postgresql() -> None:
    """A PostgreSQL server takes connections at :data:`POSTGRES_ADMIN_URL`; else a skip (a failure in CI)."""
    import psycopg

    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=10):
            pass
    except psycopg.OperationalError:
        missing_system_package(POSTGRES_NEEDED)
