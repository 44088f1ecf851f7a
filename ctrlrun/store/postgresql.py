"""What the store does differently on PostgreSQL: one module, the same names as ``sqlite``.

Decisions are serialised by locks: the key's row ``FOR UPDATE``, a delegation ``FOR SHARE`` (a
revoke in flight is waited for), one advisory lock per budget; the clock is the server's
``now()``, so hosts whose clocks disagree still agree on leases and expiries. Round trips are
saved where a statement can bring the time or do two things (the reservation's first statement
reads ``now()``; the evidence and the head's move are one statement).
"""
from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

from .. import conf
from . import sql

NAME = "postgresql"

#: The store's clock is the database server's (``sql.CLOCK``, or a statement's ``now()``).
CLOCK_IN_DATABASE = True

ROW_LOCK = " FOR UPDATE"
SHARE_LOCK = " FOR SHARE"

#: A reservation's first statement: the server's time, the chain head and the key's record (locked).
OPEN_RESERVATION = sql.OPEN_POSTGRESQL


def driver_statement(text: str) -> str:
    """psycopg takes ``%s`` as it is."""
    return text


#: How many distinct statement texts a process prepares. The store's named statements are a couple of
#: dozen; texts built per call (a phase's evidence rows, a delegation chain's length, a check's batch)
#: are more, and past this many a new text is sent server-side bound but not prepared, so the session
#: keeps a bounded set (psycopg keeps at most ``prepared_max`` per connection in any case).
_PREPARED_TEXTS_MAX = 64
_prepared_texts: set[str] = set()
_cursor_class: Any = None  # built on first use (False: no psycopg 3)


def driver_cursor(raw: Any) -> Any:
    """The cursor the store's unwatched statements run on, over the driver's connection ``raw``.

    With ``CTRLRUN_PG_PREPARE`` on (the default) and psycopg 3, a ``psycopg.Cursor``: parameters bound
    by the server and each statement prepared on its first execution in the session, so later ones are
    neither parsed nor planned again (Django's own cursor binds on the client, and never prepares).
    Off, or on psycopg2 (no server-side binding): the driver's cursor as Django made it."""
    if conf.pg_prepare():
        prepared = _prepared_cursor_class() if _cursor_class is None else _cursor_class
        if prepared and isinstance(raw, prepared.CONNECTION):
            return prepared(raw)
    return raw.cursor()


def _prepared_cursor_class() -> Any:
    """Built on first use, so that importing the store never needs psycopg 3 (SQLite, psycopg2);
    False when it is not installed."""
    global _cursor_class
    try:
        import psycopg
    except ImportError:
        _cursor_class = False
        return _cursor_class

    class PreparedCursor(psycopg.Cursor):
        CONNECTION = psycopg.Connection

        def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
            if query not in _prepared_texts:
                if len(_prepared_texts) >= _PREPARED_TEXTS_MAX:
                    return super().execute(query, params, prepare=False)
                _prepared_texts.add(query)
            connection = self.connection
            if connection.prepare_threshold is not None:
                return super().execute(query, params, prepare=True)
            # Django opens psycopg's connection with prepare_threshold=None, under which psycopg prepares
            # nothing; it is lifted for this statement only, so no other statement is prepared or counted.
            connection.prepare_threshold = 0
            try:
                return super().execute(query, params, prepare=True)
            finally:
                connection.prepare_threshold = None

    _cursor_class = PreparedCursor
    return _cursor_class


def split_open(row: tuple) -> tuple[dt.datetime | None, tuple]:
    """``OPEN_RESERVATION``'s row as (the database's time; the head and record)."""
    return row[0], row[1:]


def lock_budgets(statements: Any, keys: list[int]) -> None:
    """Take each budget's advisory lock (in the order given: one order for every writer), held until
    the phase commits. ``statements`` opens the store's cursor."""
    with statements() as cursor:
        for key in keys:
            cursor.execute(sql.BUDGET_LOCK, [key]).fetchone()


def append_evidence(cursor: Any, events: tuple[str, list[Any]] | None, receipts: tuple[str, list[Any]] | None,
                    head: list[Any]) -> None:
    """The events, the receipts and the head's move in one round trip: data-modifying CTEs all run,
    referenced or not."""
    parts = [(f"{name} AS ({statement[0]})", statement[1]) for name, statement in (("e", events), ("r", receipts))
             if statement is not None]
    prefix = "WITH " + ", ".join(text for text, _ in parts) + " " if parts else ""
    cursor.execute(prefix + sql.HEAD_MOVE, [param for _, params in parts for param in params] + head)


def time_param(connection: Any) -> Any:
    """How a datetime goes into raw SQL: Django's adaptation (psycopg takes aware times)."""
    return connection.ops.adapt_datetimefield_value


def citing_condition(document: str) -> str:
    """"The receipt ``document`` cites the control %s": its ``controls`` list holds it, whole. A
    document that is not JSON makes the query fail (PostgreSQL cannot ask that before version 16)."""
    controls = f"({document}::jsonb -> 'controls')"
    return f"(jsonb_typeof({controls}) = 'array' AND {controls} ? %s)"


VERIFY_TIME = '"ts"'


def connected(connection: Any) -> None:
    """A new Django connection: nothing to start (SQLite's background checkpointer has no counterpart)."""


@contextlib.contextmanager
def lock_hash(connection: Any, sha: Any) -> Iterator[None]:
    """PostgreSQL's guard hashes with its own ``sha256()``: nothing to define."""
    yield


def name_lift(cursor: Any, token: str) -> None:
    """Name the revealed preimage in the transaction-local ``ctrlrun.retention`` the guard compares with
    the open lock ('' clears it before commit)."""
    cursor.execute("SELECT set_config('ctrlrun.retention', %s, true)", [token])
