"""Fixtures shared by the integration tests: a policy per test, a principal, a test clock,
and a way to run a plain Python script as a separate OS process against the test store."""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

REFUND_POLICY = """\
schema: ctrlrun.policy/v2

actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000000 }
        decision: approve
      - decision: deny
  email.send:
    effect: "email:{msg_id}"
    decision: allow
  audit.note:
    decision: allow
  iam.grant_admin:
    decision: deny
"""


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


class Clock:
    """A clock the tests move by hand, so leases lapse without sleeping."""

    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **kwargs: float) -> None:
        self.now += dt.timedelta(**kwargs)


@pytest.fixture
def clock():
    from ctrlrun import conf

    fake = Clock()
    conf.set_clock(fake)
    yield fake
    conf.set_clock(None)


def store_environment() -> dict[str, str]:
    """Environment variables that point a standalone ctrlrun process at the test database."""
    from django.db import connection

    settings_dict = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL",
                                                           "CTRLRUN_STORE_URL", "CTRLRUN_STATE")}
    env["PYTHONPATH"] = str(REPO)
    if connection.vendor == "sqlite":
        env["CTRLRUN_STATE"] = settings_dict["NAME"]
    else:
        user = settings_dict.get("USER") or "postgres"
        password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        env["CTRLRUN_STORE_URL"] = f"postgresql://{user}{password}@{host}:{port}/{settings_dict['NAME']}"
    return env


@pytest.fixture
def run_script(tmp_path):
    """Run Python source as a separate OS process on the test store; return the CompletedProcess."""

    def run(source: str, policy: str = REFUND_POLICY, timeout: float = 120, **extra_env: str):
        (tmp_path / "ctrlrun.yaml").write_text(policy)
        script = tmp_path / "script.py"
        script.write_text(textwrap.dedent(source))
        env = store_environment()
        env["CTRLRUN_CONFIG"] = str(tmp_path / "ctrlrun.yaml")
        env.update(extra_env)
        return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=timeout)

    return run
