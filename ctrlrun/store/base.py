"""The store's plumbing: which database (and its dialect), the clock, one phase, one read, the raw
hot-path cursor.

Every other module of the store reaches the database through these: ``alias()`` is the one place
the alias is read (``using()`` overrides it for a block), ``write_phase`` the one way a write
transaction opens, ``reading`` the one way a read outside a phase maps database trouble.
"""
from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import Error as DjangoDatabaseError
from django.db import connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .. import conf, messages
from ..receipts import event_time
from ..errors import InvalidArgument, StoreUnavailable
from . import checkpoint, postgresql, sql, sqlite
from . import clock as clock_skew

#: The alias a ``using()`` block chose, or None: the configured one (``CTRLRUN_DATABASE``).
_alias: contextvars.ContextVar[str | None] = contextvars.ContextVar("ctrlrun_store_alias", default=None)


def alias() -> str:
    """Which ``DATABASES`` entry every store statement runs on, here and now (``using()``'s, else the
    configured one): the ONE place it is read."""
    return _alias.get() or conf.database_alias()


_DIALECTS = {"sqlite": sqlite, "postgresql": postgresql}


def dialect(connection: Any = None) -> Any:
    """The module that says what the store does differently on this connection's database
    (``store.sqlite`` or ``store.postgresql``)."""
    vendor = (connection or connections[alias()]).vendor
    found = _DIALECTS.get(vendor)
    if found is None:
        raise StoreUnavailable(f"ctrlrun stores its evidence on SQLite or PostgreSQL, not {vendor}: point "
                               f"CTRLRUN_DATABASE at a DATABASES entry of one of them")
    return found


def connection_made(sender: Any = None, *, connection: Any, **_: Any) -> None:
    """Django's ``connection_created``: the database's dialect sets up what a store connection needs
    (SQLite: the background WAL checkpointer). A database ctrlrun does not store on is left alone."""
    found = _DIALECTS.get(connection.vendor)
    if found is not None:
        found.connected(connection)


@contextlib.contextmanager
def using(name: str) -> Iterator[str]:
    """Run store functions in this block (this thread or task only) against another configured
    database alias, which must hold ctrlrun's tables (migrated)."""
    if not isinstance(name, str) or name not in connections.settings:
        raise InvalidArgument(messages.unknown_alias(name, sorted(connections.settings)))
    token = _alias.set(name)
    try:
        yield name
    finally:
        _alias.reset(token)


def objects(model: Any) -> Any:
    return model.objects.db_manager(alias())


class _Statements:
    """The hot path's statements, run on the database driver's own cursor under Django's connection.

    Django's cursor wrapper (parameter conversion, debug hooks, a new wrapper per statement) cost more
    than the statements themselves (profiled: ~20 µs each on SQLite); the dialect's ``driver_cursor``
    gives it (on PostgreSQL, one that prepares each statement once a session). The transaction stays
    Django's (``atomic``), and driver errors still become Django's (``wrap_database_errors``), so
    ``write_phase`` maps them as before. When something watches the connection's statements (an
    ``execute_wrapper``, ``DEBUG``'s query log) they go through Django's cursor, so the watcher sees
    every one.
    """

    def __init__(self) -> None:
        self.connection = connections[alias()]
        self.watched = bool(self.connection.execute_wrappers) or self.connection.queries_logged
        found = dialect(self.connection)
        self.driver_statement = found.driver_statement
        self.driver_cursor = found.driver_cursor

    def __enter__(self) -> _Statements:
        if self.watched:
            self.cursor = self.connection.cursor()
        else:
            self.connection.ensure_connection()
            self.cursor = self.driver_cursor(self.connection.connection)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cursor.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Statements:
        if self.watched:
            self.cursor.execute(sql, params)
            return self
        with self.connection.wrap_database_errors:
            self.cursor.execute(self.driver_statement(sql), params)
        return self

    def fetchone(self) -> Any:
        with self.connection.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self.connection.wrap_database_errors:
            return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


statements = _Statements


def read_clock() -> dt.datetime:
    """The store's clock: a test clock if one is set, else the database server's (PostgreSQL), else
    this host's (SQLite: every process of one store runs on the one host that holds its file)."""
    if conf.clock_overridden():
        return conf.now()
    if dialect().CLOCK_IN_DATABASE:
        with statements() as cursor:
            return cursor.execute(sql.CLOCK).fetchone()[0]
    return conf.now()


def _unavailable(exc: DjangoDatabaseError, what: str) -> StoreUnavailable:
    # A dropped connection stays broken until closed; close it now so that the next call
    # reconnects (Django would only do this at the end of a web request).
    connections[alias()].close_if_unusable_or_obsolete()
    detail = " ".join(str(exc).split())  # drivers' messages span lines; an error is one line
    return StoreUnavailable(messages.store_unavailable(what, type(exc).__name__, detail))


@contextlib.contextmanager
def write_phase(*, clock: bool = True) -> Iterator[Any]:
    """One short, durable transaction, yielding the store's time for everything it writes;
    database trouble becomes ``StoreUnavailable``. ``clock=False`` yields None instead of reading
    PostgreSQL's clock up front: the phase's first statement brings it (a round trip saved)."""
    connection = connections[alias()]
    database = dialect(connection)
    if not connection.in_atomic_block and not connection.get_autocommit():
        # The caller's manual transaction (set_autocommit(False)): its rollback would take the phase's
        # evidence with it after the function ran. (Inside atomic(), Django's durable check refuses.)
        raise InvalidArgument(messages.OPEN_TRANSACTION)
    try:
        # BEGIN IMMEDIATE on SQLite (its transaction_mode); Django's own state kept by Django: a hand-kept
        # transaction missed its durable check once (docs/performance.md, tests/integration/test_phase_transaction.py).
        with transaction.atomic(using=connection.alias, durable=True):
            if checkpoint.inherited:  # a forked child, maybe on its parent's connection: its own checkpointer
                if checkpoint.claim(connection.settings_dict["NAME"]):
                    connection_made(connection=connection)
            if clock or conf.clock_overridden() or not database.CLOCK_IN_DATABASE:
                yield read_clock()
            else:
                yield None
        clock_skew.after_phase(connection, database)  # committed: a host's clock against the database's (§F9)
    except RuntimeError as exc:
        if "durable" in str(exc):
            raise InvalidArgument(messages.OPEN_TRANSACTION) from None
        raise
    except DjangoDatabaseError as exc:
        raise _unavailable(exc, "complete a write") from exc


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """A read outside any phase; database trouble becomes ``StoreUnavailable``."""
    try:
        yield
    except DjangoDatabaseError as exc:
        raise _unavailable(exc, "be read") from exc


def now() -> dt.datetime:
    """The store's clock, read now (what leases and expiries are compared with)."""
    with reading():
        return read_clock()


def iso_text(moment: dt.datetime | None) -> str | None:
    return None if moment is None else event_time(moment)


def text_digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def as_datetime(value: Any, connection: Any) -> dt.datetime | None:
    """A timestamp column read by raw SQL, as the ORM would read it (SQLite hands back text in the
    connection's time zone)."""
    if value is None or isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value
    if isinstance(value, str):
        value = parse_datetime(value)
    return timezone.make_aware(value, connection.timezone) if value.tzinfo is None else value


def time_param(connection: Any) -> Any:
    """How a datetime goes into raw SQL for this connection (its dialect's adaptation)."""
    return dialect(connection).time_param(connection)
