"""Receipts and events are append-only in the database itself.

Triggers refuse every UPDATE and DELETE of ``ctrlrun_receipt`` and ``ctrlrun_event`` (and, on
PostgreSQL, TRUNCATE), whoever connects, so evidence cannot be edited quietly through the ORM, a
shell or a SQL console. Someone with the rights to drop the triggers can still edit rows; the
receipt chain (``receipts --verify-chain``) is what catches that.

``install`` and ``remove`` take a connection, so tooling that must empty the tables on purpose
(a test database's flush) can lift the guard and put it back.
"""
from django.db import migrations

TABLES = ("ctrlrun_receipt", "ctrlrun_event")
MESSAGE = "ctrlrun evidence is append-only: receipts and events are never updated or deleted"

SQLITE_INSTALL = [
    f"""CREATE TRIGGER IF NOT EXISTS "{table}_no_{verb.lower()}" BEFORE {verb} ON "{table}"
        BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"""
    for table in TABLES for verb in ("UPDATE", "DELETE")
]
SQLITE_REMOVE = [f'DROP TRIGGER IF EXISTS "{table}_no_{verb.lower()}"' for table in TABLES
                 for verb in ("UPDATE", "DELETE")]

POSTGRESQL_INSTALL = [
    f"""CREATE OR REPLACE FUNCTION ctrlrun_refuse_evidence_change() RETURNS trigger AS $$
        BEGIN RAISE EXCEPTION '{MESSAGE} (% on %)', TG_OP, TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege'; END
        $$ LANGUAGE plpgsql""",
] + [
    f"""CREATE TRIGGER "{table}_append_only" BEFORE UPDATE OR DELETE ON "{table}"
        FOR EACH ROW EXECUTE FUNCTION ctrlrun_refuse_evidence_change()"""
    for table in TABLES
] + [
    f"""CREATE TRIGGER "{table}_no_truncate" BEFORE TRUNCATE ON "{table}"
        FOR EACH STATEMENT EXECUTE FUNCTION ctrlrun_refuse_evidence_change()"""
    for table in TABLES
]
POSTGRESQL_REMOVE = [
    f'DROP TRIGGER IF EXISTS "{table}_{name}" ON "{table}"' for table in TABLES for name in ("append_only", "no_truncate")
] + ["DROP FUNCTION IF EXISTS ctrlrun_refuse_evidence_change()"]

_STATEMENTS = {"sqlite": (SQLITE_INSTALL, SQLITE_REMOVE), "postgresql": (POSTGRESQL_INSTALL, POSTGRESQL_REMOVE)}


def _run(connection, which):
    statements = _STATEMENTS.get(connection.vendor)
    if statements is None:
        return  # another database: no triggers (ctrlrun supports SQLite and PostgreSQL)
    with connection.cursor() as cursor:
        for statement in statements[which]:
            cursor.execute(statement)


def install(connection):
    """Put the append-only guard in place (idempotent on SQLite; remove first on PostgreSQL)."""
    remove(connection)
    _run(connection, 0)


def remove(connection):
    _run(connection, 1)


def forwards(apps, schema_editor):
    install(schema_editor.connection)


def backwards(apps, schema_editor):
    remove(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("ctrlrun", "0005_console_groups")]
    operations = [migrations.RunPython(forwards, backwards)]
