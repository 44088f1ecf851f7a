"""Plain scripts with no Django project: configuration on first use, where the store goes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, policy_text, store_environment

POLICY = policy_text("email")  # email.send, keyed by message, allowed

CALL = """
import ctrlrun

@ctrlrun.protect("email.send", effect="email:{msg_id}")
def send(msg_id: str) -> str:
    return "sent " + msg_id

with ctrlrun.context(agent="mailer"):
    print(send(msg_id="m1"))
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE",
                        "CTRLRUN_CONFIG", "CTRLRUN_ENVIRONMENT")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run(source: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", source], cwd=cwd, env=clean_env(**env), capture_output=True,
                          text=True, timeout=120)


def test_import_configures_nothing(tmp_path):
    """`import ctrlrun` leaves Django unconfigured and creates no store."""
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    result = run("import ctrlrun; from django.conf import settings; print(settings.configured)", tmp_path)
    assert result.stdout.strip() == "False", result.stderr
    assert not (tmp_path / ".ctrlrun").exists()


def test_first_call_creates_store_beside_policy(tmp_path):
    """CTRLRUN_CONFIG=conf/p.yaml puts the store at conf/.ctrlrun/state.db, not in the cwd."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "p.yaml").write_text(POLICY)
    result = run(CALL, tmp_path, CTRLRUN_CONFIG="conf/p.yaml")
    assert result.stdout.strip() == "sent m1", result.stderr
    assert (tmp_path / "conf" / ".ctrlrun" / "state.db").exists()
    assert not (tmp_path / ".ctrlrun").exists()


def test_ctrlrun_state_names_the_store(tmp_path):
    """$CTRLRUN_STATE wins over the default location."""
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    result = run(CALL, tmp_path, CTRLRUN_STATE=str(tmp_path / "elsewhere" / "s.db"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "elsewhere" / "s.db").exists() and not (tmp_path / ".ctrlrun").exists()


def test_blank_variable_refused(tmp_path):
    """A store variable that is set but blank is InvalidArgument, not a silent default."""
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    result = run(CALL, tmp_path, CTRLRUN_STATE="  ")
    assert "InvalidArgument" in result.stderr and "CTRLRUN_STATE is set but empty" in result.stderr


def test_malformed_policy_fails_at_first_call(tmp_path):
    """A bad policy is a PolicyError at the first protected call (naming file and line), not at import."""
    (tmp_path / "ctrlrun.yaml").write_text(POLICY.replace("decision: allow", "decision: maybe"))
    imported = run("import ctrlrun", tmp_path)
    assert imported.returncode == 0
    result = run(CALL, tmp_path)
    assert "PolicyError" in result.stderr
    assert "ctrlrun.yaml" in result.stderr and "line 5" in result.stderr and "maybe" in result.stderr
    assert not (tmp_path / ".ctrlrun").exists()  # a policy that does not load creates no store


def test_missing_policy_is_policy_error(tmp_path):
    """No policy file: PolicyError saying it could not be read, and nothing is left behind."""
    result = run(CALL, tmp_path)
    assert "PolicyError" in result.stderr and "could not be read" in result.stderr
    assert not (tmp_path / ".ctrlrun").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["mysql://u:secret@db.internal/app", "oracle://u:p@h/db"])
def test_a_store_url_for_another_database_is_one_clear_line(tmp_path, url):
    """CTRLRUN_STORE_URL for MySQL: the call and the command say ctrlrun's store must be SQLite or PostgreSQL."""
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    result = run(CALL, tmp_path, CTRLRUN_STORE_URL=url)
    assert "InvalidArgument: ctrlrun's store must be SQLite or PostgreSQL" in result.stderr
    assert "secret" not in result.stderr
    command = subprocess.run([sys.executable, "-m", "ctrlrun", "receipts"], cwd=tmp_path,
                             env=clean_env(CTRLRUN_STORE_URL=url), capture_output=True, text=True, timeout=120)
    assert command.returncode == 1 and command.stdout == ""
    assert command.stderr.startswith("Error: ctrlrun's store must be SQLite or PostgreSQL")
    assert len(command.stderr.strip().splitlines()) == 1 and "secret" not in command.stderr


def test_without_a_configured_key_a_key_file_beside_the_store_signs_it(tmp_path):
    """No CTRLRUN_SIGNING_KEY: the first call makes .ctrlrun/signing.key (0600); a different key is refused."""
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    keyless = {k: v for k, v in clean_env().items() if k != "CTRLRUN_SIGNING_KEY"}
    first = subprocess.run([sys.executable, "-c", CALL], cwd=tmp_path, env=keyless, capture_output=True, text=True,
                           timeout=120)
    assert first.stdout.strip() == "sent m1", first.stderr
    key_file = tmp_path / ".ctrlrun" / "signing.key"
    assert key_file.exists() and (key_file.stat().st_mode & 0o777) == 0o600
    verified = subprocess.run([sys.executable, "-m", "ctrlrun", "receipts", "--verify-chain"], cwd=tmp_path,
                              env=keyless, capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and "the chain is intact" in verified.stdout, verified.stdout + verified.stderr
    other = run(CALL.replace("m1", "m2"), tmp_path, CTRLRUN_SIGNING_KEY="another-key-0123456789abcdef")
    assert "EvidenceTampered" in other.stderr and "every process of one store needs the same" in other.stderr
    assert "sent m2" not in other.stdout


def test_store_url_uses_the_shared_database(transactional_db, tmp_path):
    """CTRLRUN_STORE_URL / CTRLRUN_STATE point a script at the shared store the tests read."""
    from ctrlrun.models import EffectRecord

    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    env = store_environment()
    result = subprocess.run([sys.executable, "-c", CALL], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "sent m1", result.stderr
    assert EffectRecord.objects.get(pk="email:m1").state == "committed"
