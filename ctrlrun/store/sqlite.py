"""What the store does differently on SQLite: one module, the same names as ``postgresql``.

``base.dialect()`` picks this module or that one by the connection's vendor, and the rest of the
store asks it instead of testing the vendor (``tests/unit/test_store_surfaces.py`` holds the two to
one set of names). On SQLite every write transaction is ``BEGIN IMMEDIATE``
(``standalone.sqlite_options``), so it serialises the decisions that PostgreSQL serialises with
row and advisory locks; the clock is the host's, the only one a file's processes can share.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

from django.db import transaction

from .. import conf
from ..errors import InvalidArgument
from . import checkpoint, sql

NAME = "sqlite"

#: The store's clock is this host's (``conf.now()``), never a statement's.
CLOCK_IN_DATABASE = False

#: A decision's row is already the writer's: BEGIN IMMEDIATE took the database.
ROW_LOCK = ""
SHARE_LOCK = ""

#: A reservation's first statement: the chain head and the key's record.
OPEN_RESERVATION = sql.OPEN_SQLITE

_qmark: dict[str, str] = {}


@contextlib.contextmanager
def phase_transaction(connection: Any) -> Iterator[None]:
    """A phase's transaction: ``BEGIN IMMEDIATE`` and ``COMMIT`` sent on the driver's connection.

    Django's ``atomic(durable=True)`` sends the same two statements through its own cursor and its
    autocommit switching, which cost about as much again as the statements (measured: ~75 µs a
    phase against ~35 µs). Django is told the truth for the phase's length: its connection is in a
    transaction (``in_atomic_block``, no autocommit), so the ORM statements a phase makes join it,
    a nested ``atomic()`` is a savepoint and ``on_commit`` hooks wait for the commit, which runs
    them. Inside any transaction Django already holds (a test case's, or a caller's: refused as
    ``atomic(durable=True)`` refuses it), and while something watches the connection's statements
    (an ``execute_wrapper``, ``DEBUG``'s query log: it sees the BEGIN and the commit), the phase is
    Django's own ``atomic(durable=True)``.
    """
    if (connection.in_atomic_block or not connection.get_autocommit() or connection.execute_wrappers
            or connection.queries_logged):
        with transaction.atomic(using=connection.alias, durable=True):
            yield
        return
    connection.ensure_connection()
    driver = connection.connection
    with connection.wrap_database_errors:
        driver.execute("BEGIN IMMEDIATE")
    connection.in_atomic_block, connection.autocommit, connection.needs_rollback = True, False, False
    try:
        yield
    except BaseException:
        _end(connection, driver, "ROLLBACK")
        raise
    if connection.needs_rollback:  # an ORM statement failed inside and its error was swallowed
        _end(connection, driver, "ROLLBACK")
        raise transaction.TransactionManagementError("a ctrlrun phase's statement failed; nothing was written")
    _end(connection, driver, "COMMIT")
    connection.run_and_clear_commit_hooks()


def _end(connection: Any, driver: Any, statement: str) -> None:
    """End the phase's transaction and give Django its connection back in autocommit; the commit
    hooks are dropped unless the commit went through."""
    committed = False
    try:
        with connection.wrap_database_errors:
            driver.execute(statement)
        committed = statement == "COMMIT"
    except BaseException:
        if driver.in_transaction:  # a commit that failed leaves the transaction open
            with contextlib.suppress(Exception):
                driver.execute("ROLLBACK")
        raise
    finally:
        connection.in_atomic_block, connection.autocommit, connection.needs_rollback = False, True, False
        connection.savepoint_ids = []
        if not committed:
            connection.run_on_commit = []


def driver_statement(text: str) -> str:
    """A statement for the driver's own cursor: ``%s`` becomes ``?`` (converted once per text)."""
    converted = _qmark.get(text)
    if converted is None:
        converted = _qmark[text] = text.replace("%s", "?")
    return converted


def driver_cursor(raw: Any) -> Any:
    """The cursor the store's unwatched statements run on: the driver's own (SQLite prepares and
    caches statements by itself, ``sqlite3``'s statement cache)."""
    return raw.cursor()


def split_open(row: tuple) -> tuple[dt.datetime | None, tuple]:
    """``OPEN_RESERVATION``'s row as (the database's time, or None here; the head and record)."""
    return None, row


def lock_budgets(statements: Any, keys: list[int]) -> None:
    """Nothing to take: the write transaction is exclusive already (no statement is sent)."""


def append_evidence(cursor: Any, events: tuple[str, list[Any]] | None, receipts: tuple[str, list[Any]] | None,
                    head: list[Any]) -> None:
    """The events, the receipts and the head's move: one statement each."""
    for statement in (events, receipts):
        if statement is not None:
            cursor.execute(*statement)
    cursor.execute(sql.HEAD_MOVE, head)


def time_param(connection: Any) -> Any:
    """How a datetime goes into raw SQL: in UTC (the common case) Django's text made without its
    per-call settings lookups, else Django's own adaptation."""
    return _utc_text if connection.timezone_name == "UTC" else connection.ops.adapt_datetimefield_value


_recent_texts: dict[dt.datetime, str] = {}


def _utc_text(value: dt.datetime | None) -> str | None:
    """Django's SQLite text for an aware time (naive UTC, ``str()``); one phase writes the same few
    times many times over, so the last few are kept."""
    if value is None:
        return None
    text = _recent_texts.get(value)
    if text is None:
        if len(_recent_texts) > 8:
            _recent_texts.clear()
        text = _recent_texts[value] = str(value.astimezone(dt.timezone.utc).replace(tzinfo=None))
    return text


def citing_condition(document: str) -> str:
    """"The receipt ``document`` cites the control %s": its ``controls`` list holds it, whole. A
    document that is not JSON, or whose ``controls`` is not a list, cites nothing."""
    return (f"(CASE WHEN json_valid({document}) THEN (CASE WHEN json_type({document}, '$.controls') = 'array' "
            f"THEN EXISTS (SELECT 1 FROM json_each({document}, '$.controls') AS cited "
            f"WHERE cited.type = 'text' AND cited.value = %s) ELSE 0 END) ELSE 0 END)")


#: The ``ts`` column as verification reads it: its text, so a row altered into an impossible time is
#: a named break rather than a crash in the driver's converter.
VERIFY_TIME = 'CAST("ts" AS TEXT)'


_said_bad_setting = False


def connected(connection: Any) -> None:
    """A new Django connection: a database file in WAL mode gets this process's background checkpointer
    (``store.checkpoint``), and this connection checkpoints only past the backstop. An in-memory
    database, a file in another journal mode, or the checkpointer turned off: nothing changes."""
    global _said_bad_setting
    if connection.is_in_memory_db():
        return
    try:
        interval = conf.sqlite_checkpoint_seconds()
    except InvalidArgument as exc:  # said once, and calls go on as without the checkpointer
        if not _said_bad_setting:
            _said_bad_setting = True
            logging.getLogger("ctrlrun.store").error("%s; SQLite's automatic checkpoint is left in place", exc)
        return
    if interval is None:
        return
    raw = connection.connection
    (mode,) = raw.execute("PRAGMA journal_mode").fetchone()
    if str(mode).lower() != "wal":
        return
    raw.execute(f"PRAGMA wal_autocheckpoint={checkpoint.BACKSTOP_PAGES}")
    checkpoint.watch(connection.settings_dict["NAME"], interval)
