"""``manage.py check`` says when the database's guard is missing, older than the code expects, short of
a trigger, or newer (ctrlrun.W005), from the version the guard records; ``migrate ctrlrun`` puts the
newest version back. On the test database (either vendor), every ctrlrun migration applied."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from ctrlrun import guards
from ctrlrun.checks import check_guard

pytestmark = pytest.mark.usefixtures("transactional_db")  # (the guard is lifted for the flush after each)


def _w005() -> list[str]:
    return [f"{m.msg} | {m.hint}" for m in check_guard() if m.id == "ctrlrun.W005"]


def test_a_migrated_database_has_the_newest_guard_and_no_warning():
    assert guards.installed(connection) == guards.CURRENT
    assert guards.missing_triggers(connection, guards.CURRENT) == []
    assert _w005() == []


def test_a_removed_guard_is_said_and_migrate_puts_it_back():
    guards.remove(connection)
    [said] = _w005()
    assert "records no ctrlrun guard" in said and f"expects guard version {guards.CURRENT}" in said, said
    assert "python manage.py migrate ctrlrun" in said, said
    call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
    assert guards.installed(connection) == guards.CURRENT and _w005() == []


def test_an_older_version_is_said_naming_both():
    guards.install(connection, 5)
    [said] = _w005()
    assert (f"guard version 5, older than version {guards.CURRENT}" in said
            and f"expects guard version {guards.CURRENT}" in said), said
    call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
    assert guards.installed(connection) == guards.CURRENT and _w005() == []


def test_a_trigger_dropped_by_hand_is_named():
    name, table = guards.triggers(guards.CURRENT, connection.vendor)[0]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TRIGGER "{name}"' + (f' ON "{table}"' if connection.vendor == "postgresql" else ""))
    [said] = _w005()
    assert f"records ctrlrun guard version {guards.CURRENT} but lacks 1 of its triggers ({name})" in said, said
    call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
    assert guards.missing_triggers(connection, guards.CURRENT) == [] and _w005() == []


def test_a_newer_version_is_said_and_never_replaced():
    guards.remove(connection)
    with connection.cursor() as cursor:
        for statement in guards.statements(guards.CURRENT, connection.vendor) + guards.record(99, connection.vendor):
            cursor.execute(statement)
    [said] = _w005()
    assert f"guard version 99, newer than version {guards.CURRENT} this code knows" in said, said
    call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
    assert guards.installed(connection) == 99
    guards.install(connection, guards.CURRENT)
