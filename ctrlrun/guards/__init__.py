"""The guard's versions: each migration that installs the guard installs a frozen one, never today's.

``v1`` … ``v14`` hold each version's statements (SQLite and PostgreSQL) as the migration that
installs it was written: generated once by ``freeze.py`` from ``ctrlrun/guard.py`` as it stood at
that migration's commit, then never edited (``tests/unit/test_guard_versions.py`` pins each one's
digest, and that the newest equals what ``guard.py`` builds today, so a change to the guard is a new
version and a migration that installs it).

An installed guard records its version: on PostgreSQL the function ``ctrlrun_guard_version()``,
returning it; on SQLite the view ``ctrlrun_guard_version`` (one row, one column ``version``).
``manage.py check`` compares it with :data:`CURRENT` (``ctrlrun.W005``).

=======  ==============================  ===============================================
version  installed by                    what it adds
=======  ==============================  ===============================================
1        0008_event_chain_and_signatures  append-only evidence, effect and approval state
                                          tables, the chain head only forward
2        0009_chain_checks               the table of chain checks is evidence too
3        0013_budget_ledger              budget ledger rows are never deleted
4        0014_delegations                delegations are revoked once, never deleted
5        0015_ledger_release_only        a ledger row only ever gets released_at, once
6        0016_signed_rows                a check's nonce and a charge's identity never
                                          collide; new signatures held with their rows
7        0017_approval_returned,         approvals given back (``returned``), paused runs,
         0018_guard_version              the head is the one row
8        0022_approval_preconditions     an approval's precondition fingerprint is fixed
9        0024_notifications              mail deliveries keep who and why; a mail link's
                                          use is recorded once
10       0025_verified_approvers         an approval's pinned roles and count are kept;
                                          a pending one may gain approvers (M-of-N)
11       0026_ledger_chains              a ledger row's place and running total are fixed;
                                          a new row continues its (grant, metric) chain
12       0027_retention                  receipts deleted only by a prune (the retention
                                          lock), checkpoints, holds
13       0031_suspended_continuations    a continuation keeps its key, is never deleted
14       0032_ledger_predecessor         PostgreSQL: a new ledger row's predecessor found
                                          through the unique index of the places, with or
                                          without statistics (the same checks)
=======  ==============================  ===============================================
"""
from __future__ import annotations

import importlib
import re
from functools import lru_cache
from typing import Any

__all__ = ["CURRENT", "VERSIONS", "install", "remove", "installed", "missing_triggers", "statements", "problem",
           "repair"]

#: The version this code expects installed (the newest; the one ``guard.py`` builds).
CURRENT = 14
VERSIONS = tuple(range(1, CURRENT + 1))
#: Where the version is recorded (a PostgreSQL function, a SQLite view).
RECORD = "ctrlrun_guard_version"
VENDORS = ("sqlite", "postgresql")


@lru_cache(maxsize=None)
def _module(version: int) -> Any:
    if version not in VERSIONS:
        raise ValueError(f"there is no ctrlrun guard version {version!r} (versions 1 to {CURRENT})")
    return importlib.import_module(f"{__name__}.v{version}")


def statements(version: int, vendor: str) -> list[str]:
    """The frozen statements of ``version`` for a database ``vendor``, without its version record."""
    module = _module(version)
    return list({"sqlite": module.SQLITE, "postgresql": module.POSTGRESQL}.get(vendor, []))


def migration(version: int) -> str:
    """The migration that installs ``version``."""
    return _module(version).MIGRATION


def record(version: int, vendor: str) -> list[str]:
    """The statement that records ``version`` as installed."""
    number = int(version)
    if vendor == "sqlite":
        return [f'CREATE VIEW "{RECORD}" AS SELECT {number} AS version']
    if vendor == "postgresql":
        return [f"CREATE OR REPLACE FUNCTION {RECORD}() RETURNS integer AS $$ SELECT {number} $$ "
                "LANGUAGE sql IMMUTABLE"]
    return []


_SQLITE_TRIGGER = re.compile(r'^CREATE TRIGGER "([^"]+)"')
_PG_TRIGGER = re.compile(r'^CREATE TRIGGER "([^"]+)" .*? ON "([^"]+)"', re.S)
_PG_FUNCTION = re.compile(r"^CREATE OR REPLACE FUNCTION (\w+)\(\)")


def triggers(version: int, vendor: str) -> list[tuple[str, str]]:
    """(trigger, table) for each trigger of ``version`` (SQLite: the table is not named, '')."""
    out = []
    for statement in statements(version, vendor):
        if vendor == "sqlite" and (match := _SQLITE_TRIGGER.match(statement)):
            out.append((match.group(1), ""))
        elif vendor == "postgresql" and (match := _PG_TRIGGER.match(statement)):
            out.append((match.group(1), match.group(2)))
    return out


def _functions(version: int) -> list[str]:
    return [m.group(1) for s in statements(version, "postgresql") if (m := _PG_FUNCTION.match(s))]


def _removal(vendor: str, present: set[str]) -> list[str]:
    """Drop every trigger and function any version made (0006's included: version 1 has its names),
    and the version record."""
    if vendor == "sqlite":
        names = dict.fromkeys(name for v in VERSIONS for name, _ in triggers(v, vendor))
        return [f'DROP TRIGGER IF EXISTS "{name}"' for name in names] + [f'DROP VIEW IF EXISTS "{RECORD}"']
    if vendor == "postgresql":
        pairs = dict.fromkeys(pair for v in VERSIONS for pair in triggers(v, vendor) if pair[1] in present)
        functions = dict.fromkeys(f for v in VERSIONS for f in _functions(v))
        return ([f'DROP TRIGGER IF EXISTS "{name}" ON "{table}"' for name, table in pairs]
                + [f"DROP FUNCTION IF EXISTS {name}()" for name in functions]
                + [f"DROP FUNCTION IF EXISTS {RECORD}()"])
    return []


def _run(connection: Any, sql: list[str]) -> None:
    with connection.cursor() as cursor:
        for statement in sql:
            cursor.execute(statement)


def install(connection: Any, version: int) -> None:
    """Put guard ``version`` in place, with its version record (replacing whatever guard was there), in
    one transaction."""
    from django.db import transaction

    sql = statements(version, connection.vendor) + record(version, connection.vendor)
    with transaction.atomic(using=connection.alias):  # all of it or nothing (both databases' DDL is transactional)
        remove(connection)
        _run(connection, sql)


def remove(connection: Any) -> None:
    """Lift the guard, whichever version, and its version record (a test database's flush, a
    migration that changes a guarded table; never in production)."""
    _run(connection, _removal(connection.vendor, set(connection.introspection.table_names())))


def installed(connection: Any) -> int | None:
    """The version the database records as installed; None if it records none (no guard, or one
    from before guards were versioned). Reads the catalog first, so a missing record raises nothing
    (a PostgreSQL transaction stays usable)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'view' AND name = %s", [RECORD])
            if cursor.fetchone() is None:
                return None
            cursor.execute(f'SELECT version FROM "{RECORD}"')
        elif connection.vendor == "postgresql":
            cursor.execute("SELECT 1 FROM pg_proc WHERE proname = %s AND pg_function_is_visible(oid)", [RECORD])
            if cursor.fetchone() is None:
                return None
            cursor.execute(f"SELECT {RECORD}()")
        else:
            return None
        row = cursor.fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None


def missing_triggers(connection: Any, version: int) -> list[str]:
    """The triggers of ``version`` the database does not have (dropped by hand), by name."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        elif connection.vendor == "postgresql":
            cursor.execute("SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                           "WHERE NOT t.tgisinternal AND pg_table_is_visible(c.oid)")
        else:
            return []
        have = {name for (name,) in cursor.fetchall()}
    return [name for name, _ in triggers(version, connection.vendor) if name not in have]


def migrations_pending(connection: Any) -> bool:
    """Whether any ctrlrun migration is not applied on this database (then the guard is the
    migrations' business: the next ``migrate`` installs the version of each)."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == "ctrlrun"]
    return bool(executor.migration_plan(targets))


def problem(connection: Any) -> tuple[int | None, list[str]] | None:
    """What is wrong with the database's guard: (the version it records, the triggers of that version
    it lacks), or None when it records :data:`CURRENT` with every trigger. A newer version is a
    problem too (this code is older than the database's guard), but never replaced by :func:`repair`."""
    version = installed(connection)
    if version is not None and version > CURRENT:
        return version, []
    missing = missing_triggers(connection, version) if version is not None else []
    if version == CURRENT and not missing:
        return None
    return version, missing


def repair(connection: Any) -> int | None:
    """After ``migrate``: with every ctrlrun migration applied, a guard that is missing, older than
    :data:`CURRENT` or short of a trigger (dropped by hand) is replaced by :data:`CURRENT` (what the
    newest guard migration installs). Returns the version installed, or None (nothing to do)."""
    if connection.vendor not in VENDORS or migrations_pending(connection):
        return None
    found = problem(connection)
    if found is None or (found[0] is not None and found[0] > CURRENT):
        return None
    install(connection, CURRENT)
    return CURRENT
