"""Run ctrlrun from a plain script, with no Django project: configure Django on first use.

Inside a Django project (settings configured, or ``DJANGO_SETTINGS_MODULE`` set) this module
only makes sure ``django.setup()`` has run. Otherwise it configures a minimal Django with one
app, ``ctrlrun``, and one database:

- PostgreSQL (or any URL django-environ understands) when ``CTRLRUN_STORE_URL`` or
  ``DATABASE_URL`` is set;
- else SQLite at ``$CTRLRUN_STATE``, else ``.ctrlrun/state.db`` beside the policy file.

The store's tables are created on first use by Django's own migrations, under a lock so that
several processes starting together do not race for the schema. Read-only entry points pass
``create=False``: they never create a store, and say so when there is none.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import InvalidArgument, StoreUnavailable

__all__ = ["ensure_ready", "configure", "configure_settings", "state_path", "store_url", "sqlite_options",
           "describe_store"]

#: SQLite waits this long for a competing writer before it gives up (5 s: several hundred
#: short ctrlrun transactions' worth, far beyond any healthy queue).
SQLITE_BUSY_TIMEOUT_SECONDS = 5

_ready = False


def sqlite_options() -> dict[str, Any]:
    """SQLite settings every ctrlrun store needs, standalone or in a project.

    IMMEDIATE transactions take the write lock at BEGIN, so a read-then-write decision (is
    this key free? then take it) can never interleave with another process's; WAL lets readers
    run beside the one writer; ``synchronous=NORMAL`` is durable across process crashes in WAL.
    """
    return {
        "transaction_mode": "IMMEDIATE",
        "timeout": SQLITE_BUSY_TIMEOUT_SECONDS,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    }


def store_url() -> str | None:
    for name in ("CTRLRUN_STORE_URL", "DATABASE_URL"):
        value = os.environ.get(name)
        if value is not None:
            if not value.strip():
                raise InvalidArgument(f"{name} is set but empty; unset it or give it a database URL")
            return value.strip()
    return None


def policy_location() -> Path:
    value = os.environ.get("CTRLRUN_CONFIG")
    if value is not None and not value.strip():
        raise InvalidArgument("CTRLRUN_CONFIG is set but empty; unset it or point it at a policy file")
    return Path(value.strip()).absolute() if value else Path.cwd() / "ctrlrun.yaml"


def state_path() -> Path:
    """Where the standalone SQLite store lives: ``$CTRLRUN_STATE`` or beside the policy."""
    value = os.environ.get("CTRLRUN_STATE")
    if value is not None:
        if not value.strip():
            raise InvalidArgument("CTRLRUN_STATE is set but empty; unset it or give it a file path")
        return Path(value.strip()).absolute()
    return policy_location().parent / ".ctrlrun" / "state.db"


#: The database engines ctrlrun's SQL and triggers are written for.
SUPPORTED_ENGINES = ("django.db.backends.sqlite3", "django.db.backends.postgresql")


def _database() -> dict[str, Any]:
    """The store's ``DATABASES`` entry. Creates nothing: the file appears when the store is made."""
    url = store_url()
    if url:
        import environ

        try:
            database = environ.Env.db_url_config(url)
        except Exception as exc:
            raise InvalidArgument(f"the store URL {url!r} could not be read: {exc}") from None
        engine = database.get("ENGINE", "")
        if engine not in SUPPORTED_ENGINES:
            scheme = url.split(":", 1)[0]
            raise InvalidArgument(
                f"ctrlrun's store must be SQLite or PostgreSQL, and the store URL is {scheme}://...; point "
                f"CTRLRUN_STORE_URL (or DATABASE_URL) at postgresql://... or sqlite:///..., or unset it for "
                f"the embedded SQLite store"
            )
        if engine.endswith("sqlite3"):
            database.setdefault("OPTIONS", {}).update(sqlite_options())
        return database
    path = state_path()
    if str(path).endswith(":memory:"):
        raise InvalidArgument("an in-memory store would forget every effect at exit; give CTRLRUN_STATE a file path")
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path), "OPTIONS": sqlite_options()}


def describe_store() -> str:
    """A one-line, password-free description of where the store is, for messages."""
    from django.db import connections

    from . import conf

    settings_dict = connections[conf.database_alias()].settings_dict
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"SQLite {settings_dict['NAME']}"
    host = settings_dict.get("HOST") or "localhost"
    return f"{settings_dict['ENGINE'].rsplit('.', 1)[-1]} {settings_dict.get('NAME')} on {host}"


def configure_settings() -> None:
    """Django configured and set up (standalone: for the store, which is not touched yet)."""
    from django.conf import settings

    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        settings.configure(
            DATABASES={"default": _database()},
            INSTALLED_APPS=["ctrlrun"],
            USE_TZ=True,
            TIME_ZONE="UTC",
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
            CTRLRUN_POLICY=str(policy_location()),
            CTRLRUN_STANDALONE=True,
            LOGGING_CONFIG=None,
        )
    _setup()


def _no_store(path: Path, command: str | None) -> str:
    """Why a read command found no store at ``path``, and what to do, from where it looked."""
    read = "A read command does not create one; run a protected call first (it creates the store)"
    for name in ("CTRLRUN_STORE_URL", "DATABASE_URL"):
        if os.environ.get(name) is not None:
            return f"no database at '{path}' (the SQLite file {name} names). {read}, or point {name} at an existing store"
    if os.environ.get("CTRLRUN_STATE") is not None:
        return f"no database at '{path}'. {read}, or point CTRLRUN_STATE at an existing store"
    policy = policy_location()
    folder = Path.cwd()
    if os.environ.get("CTRLRUN_CONFIG") is None and (folder / "manage.py").exists():
        run = f"'python manage.py {command or 'COMMAND'}'"
        return (f"this folder has manage.py and no ctrlrun store of a script ({path}): in a Django project run {run}, "
                f"which reads the project's database; 'ctrlrun' is for a plain script's folder")
    if not policy.exists():
        where = "(CTRLRUN_CONFIG)" if os.environ.get("CTRLRUN_CONFIG") is not None else "here"
        if where == "here":
            return (f"no ctrlrun.yaml in {policy.parent}, so no ctrlrun store here (it is kept in .ctrlrun/ beside the "
                    f"policy): run the command in your script's folder, set CTRLRUN_CONFIG to its policy (or "
                    f"CTRLRUN_STATE to its store), or start one here with 'ctrlrun init'")
        return (f"no policy at {policy} {where}, so no ctrlrun store beside it: point CTRLRUN_CONFIG at your script's "
                f"ctrlrun.yaml (or CTRLRUN_STATE at its store)")
    return f"no database at '{path}'. {read}, or point CTRLRUN_STATE at an existing store"


def configure(create: bool = True, command: str | None = None) -> None:
    """Configure Django for standalone use (inside a project: only ``django.setup()``).

    Standalone, the store is then created and migrated (``create``) or required to exist (read
    commands; ``command`` is the one being run, for the message). A store that cannot be reached
    is ``StoreUnavailable`` naming where it looked.
    """
    from django.conf import settings
    from django.db import Error as DatabaseError  # InterfaceError too

    configure_settings()
    if not getattr(settings, "CTRLRUN_STANDALONE", False):
        return
    from django.db import connections

    from . import conf

    settings_dict = connections[conf.database_alias()].settings_dict
    if settings_dict["ENGINE"].endswith("sqlite3"):
        path = Path(settings_dict["NAME"])
        if not path.exists():
            if not create:
                raise StoreUnavailable(_no_store(path, command))
            path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _refuse_reference_store(connections[conf.database_alias()])
        if create:
            migrate()
        else:
            _require_tables()
    except DatabaseError as exc:
        raise StoreUnavailable(
            f"the ctrlrun store ({describe_store()}) could not be opened: {' '.join(str(exc).split())}. Check "
            f"CTRLRUN_STORE_URL / DATABASE_URL / CTRLRUN_STATE; nothing ran"
        ) from None


def _refuse_reference_store(connection: Any) -> None:
    """The reference's store is not ours to open: creating our tables beside its own would forget every
    key it ran (a refund it committed would run again). It is imported instead (docs/importing.md)."""
    from .reference_store import holds_reference_tables

    if connection.vendor == "sqlite" and not Path(connection.settings_dict["NAME"]).exists():
        return
    if not holds_reference_tables(connection):
        return
    if connection.vendor == "sqlite":
        here = Path(connection.settings_dict["NAME"])
        aside = here.with_name("reference-" + here.name)
        how = f"move it aside and import it: mv {here} {aside} && ctrlrun import {aside}"
    else:
        how = "point this ctrlrun at a database of its own and import the reference's (ctrlrun import, from SQLite)"
    raise StoreUnavailable(f"the store {describe_store()} was written by the reference ctrlrun (PyPI 'ctrlrun'): "
                           "this ctrlrun keeps its own store and, opened on that one, would run again the keys it "
                           f"ran. To move to this ctrlrun, {how} (docs/importing.md); nothing ran")


def _setup() -> None:
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def ensure_ready() -> None:
    """Make Django usable; standalone scripts get their store created and migrated."""
    global _ready
    if _ready:
        return
    configure(create=True)
    _ready = True


@contextlib.contextmanager
def _schema_lock() -> Iterator[None]:
    """Serialise migrations between processes creating the same store at the same moment."""
    from django.db import connections

    from . import conf

    connection = connections[conf.database_alias()]
    if connection.vendor == "sqlite":
        lock_path = Path(connection.settings_dict["NAME"] + ".migrate-lock")
        with open(lock_path, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
    elif connection.vendor == "postgresql":
        # An arbitrary constant key ('ctrl' in ASCII) shared by every ctrlrun process.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(1668576364)")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(1668576364)")
    else:
        yield


def migrate() -> None:
    """Apply ctrlrun's migrations if any are missing (cheap when the store is current)."""
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    from . import conf

    alias = conf.database_alias()
    connection = connections[alias]
    with _schema_lock():
        executor = MigrationExecutor(connection)
        targets = executor.loader.graph.leaf_nodes("ctrlrun")
        if executor.migration_plan(targets):
            from django.core.management import call_command

            call_command("migrate", "ctrlrun", database=alias, verbosity=0, interactive=False)


def _require_tables() -> None:
    from django.db import connections

    from . import conf

    connection = connections[conf.database_alias()]
    try:
        tables = connection.introspection.table_names()
    except Exception as exc:
        raise StoreUnavailable(
            f"the store ({describe_store()}) could not be reached: {' '.join(str(exc).split())}. Check "
            f"CTRLRUN_STORE_URL / DATABASE_URL: the host and port, the database name, the user and password, and "
            f"that the server is running; nothing ran") from None
    if "ctrlrun_receipt" not in tables:
        raise StoreUnavailable(
            f"the store ({describe_store()}) has no ctrlrun tables yet. A read command does not "
            f"create them; run a protected call first"
        )


def configure_without_store() -> None:
    """Enough Django to run a command that needs no store (--help, demo)."""
    from django.conf import settings

    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        settings.configure(INSTALLED_APPS=["ctrlrun"], USE_TZ=True, DATABASES={}, LOGGING_CONFIG=None,
                           CTRLRUN_STANDALONE=True)  # messages name 'ctrlrun ...' (ctrlrun.messages.entry)
    _setup()
