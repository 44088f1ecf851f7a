"""What the store does differently on PostgreSQL: one module, the same names as ``sqlite``.

Decisions are serialised by locks: the key's row ``FOR UPDATE``, a delegation ``FOR SHARE`` (a
revoke in flight is waited for), one advisory lock per budget; the clock is the server's
``now()``, so hosts whose clocks disagree still agree on leases and expiries. Round trips are
saved where a statement can bring the time or do two things (the reservation's first statement
reads ``now()``; the evidence and the head's move are one statement).
"""
from __future__ import annotations

import datetime as dt
from typing import Any

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
