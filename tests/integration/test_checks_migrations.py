"""``manage.py check`` names ctrlrun's migrations not applied yet (issue 25, item 9): a project that
added the app but did not ``migrate`` learns it from the check, not from "no such table" at its first
protected call. The check never gets in the way of ``migrate`` itself (it would say the tables are
missing while migrate makes them), and a database it cannot reach is said in one line, not a
traceback. Real subprocesses in a fresh ``django-admin startproject`` made from the README."""
from __future__ import annotations

import pytest

from tests.support import REPO, StartprojectSite

pytestmark = pytest.mark.slow

POLICY = "schema: ctrlrun.policy/v2\nactions: {}\n"


#: The newest migration ctrlrun ships (what a fresh project lacks last).
LATEST = max(path.stem for path in (REPO / "ctrlrun" / "migrations").glob("0*.py"))


@pytest.fixture
def site(tmp_path):
    return StartprojectSite(tmp_path, policy=POLICY)


def test_check_names_the_unapplied_migrations_until_migrate_applies_them(site):
    before = site.manage("check")
    assert before.returncode == 0, before.stderr  # a warning: makemigrations and the rest still run
    out = before.stdout + before.stderr
    assert "ctrlrun.W003" in out and "0001_initial" in out and LATEST in out, out
    assert "python manage.py migrate" in out, out
    assert "no issues" not in out
    assert "ctrlrun.W005" not in out, out  # no tables yet: W003 says what to do

    migrated = site.manage("migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "ctrlrun.W003" not in migrated.stdout + migrated.stderr  # not said while migrate makes them
    assert f"Applying ctrlrun.{LATEST}... OK" in migrated.stdout
    after = site.manage("check")
    assert after.returncode == 0 and "System check identified no issues" in after.stdout, after.stdout + after.stderr


def test_a_project_one_migration_behind_is_told_which(site):
    partly = site.manage("migrate", "ctrlrun", "0015")
    assert partly.returncode == 0, partly.stdout + partly.stderr
    checked = site.manage("check")
    out = checked.stdout + checked.stderr
    assert "ctrlrun.W005" not in out, out  # guard version 5, as 0015 installs: the migrations say the rest
    assert "ctrlrun.W003" in out and "0016_signed_rows" in out and LATEST in out and "0015" not in out.split("ctrlrun.W003")[1], out


def test_a_database_it_cannot_reach_is_said_in_one_line(site):
    settings = site.folder / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + '\nDATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", '
                        '"NAME": "nothing", "HOST": "127.0.0.1", "PORT": "1", "USER": "nobody"}}\n')
    checked = site.manage("check")
    out = checked.stdout + checked.stderr
    assert checked.returncode == 0, out
    assert "Traceback" not in out and "ctrlrun.W004" in out, out
    assert "could not read which ctrlrun migrations are applied" in out, out
    assert "ctrlrun.W005" not in out, out  # the guard is not judged on a database it cannot read


def test_the_models_need_no_migration_that_is_not_written(db):
    """Every model change has its migration (new event types change Event.type's choices, say)."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    try:
        call_command("makemigrations", "ctrlrun", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:
        raise AssertionError(f"a migration is missing (makemigrations ctrlrun):\n{out.getvalue()}") from exc
