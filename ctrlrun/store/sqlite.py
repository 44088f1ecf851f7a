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


@contextlib.contextmanager
def lock_hash(connection: Any, sha: Any) -> Iterator[None]:
    """The retention lock's hash, as the guard's SQLite trigger calls it (``ctrlrun_sha256``): defined on
    this connection for the one statement that opens the lock, then removed (store/retention.py)."""
    connection.connection.create_function("ctrlrun_sha256", 1, sha, deterministic=True)
    try:
        yield
    finally:
        connection.connection.create_function("ctrlrun_sha256", 1, None)


def name_lift(cursor: Any, token: str) -> None:
    """SQLite's triggers read the lock row alone: nothing to name."""
