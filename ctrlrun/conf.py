"""The one place that reads ctrlrun's settings.

Each setting is a Django setting named ``CTRLRUN_*``; where an environment variable of the same
purpose exists (``CTRLRUN_CONFIG``, ``CTRLRUN_ENVIRONMENT``) it is the fallback, so a plain
script and a Django project read the same knobs. Nothing else in ctrlrun touches
``django.conf.settings``.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from .errors import InvalidArgument

__all__ = [
    "policy_path",
    "environment",
    "lease",
    "approval_ttl",
    "database_alias",
    "pg_prepare",
    "hook_modules",
    "reconcile_backoff",
    "chain_check_max_age",
    "sqlite_checkpoint_seconds",
    "approver_roles_from",
    "console_verifies",
    "webhook_secret_file",
    "webhook_replay_window",
    "now",
    "clock_overridden",
    "set_clock",
]

#: Five minutes: long enough for a slow remote API call with retries inside the function,
#: short enough that a dead worker's effect is swept to AMBIGUOUS within one coffee break.
DEFAULT_LEASE_SECONDS = 300
#: Fifteen minutes from the request: a human reads and answers while the agent still cares.
DEFAULT_APPROVAL_TTL_SECONDS = 900
#: A hook that answered "unknown" is asked again after 30 s, doubling each time...
DEFAULT_BACKOFF_SECONDS = 30
#: ...up to an hour, so a remote that is down for a day costs 24 calls per record, not 2,880.
DEFAULT_BACKOFF_MAX_SECONDS = 3600


def _setting(name: str, default: Any = None) -> Any:
    from django.conf import settings

    return getattr(settings, name, default)


def _env(name: str) -> str | None:
    """An environment variable, refusing one that is set but blank (a likely typo)."""
    value = os.environ.get(name)
    if value is not None and not value.strip():
        raise InvalidArgument(f"{name} is set but empty; unset it or give it a value")
    return value.strip() if value is not None else None


def policy_path() -> Path:
    """``CTRLRUN_POLICY`` setting, else ``$CTRLRUN_CONFIG``, else ``./ctrlrun.yaml``."""
    configured = _setting("CTRLRUN_POLICY")
    if configured:
        return Path(configured)
    from_env = _env("CTRLRUN_CONFIG")
    return Path(from_env) if from_env else Path.cwd() / "ctrlrun.yaml"


def authority_path() -> Path | None:
    """A standalone authority file (§C2) to enforce with the policy: the ``CTRLRUN_AUTHORITY``
    setting, else ``$CTRLRUN_AUTHORITY``; None (the default) when the grants, if any, are inline."""
    configured = _setting("CTRLRUN_AUTHORITY")
    if configured:
        return Path(configured)
    from_env = _env("CTRLRUN_AUTHORITY")
    return Path(from_env) if from_env else None


def environment_override() -> str | None:
    """The deployment's environment, when it names one: ``CTRLRUN_ENVIRONMENT`` (setting, else the
    variable). It ranks above the policy's own ``environment:``; None leaves that to the policy."""
    configured = _setting("CTRLRUN_ENVIRONMENT")
    if configured:
        return str(configured).strip()
    return _env("CTRLRUN_ENVIRONMENT") or None


def docs_url(page: str) -> str | None:
    """Where ``page`` of ctrlrun's documentation is read (``CTRLRUN_DOCS_URL``, a base URL ending in
    ``/``, joined with ``page``, e.g. ``console.md#observe-mode``), or None when it is not set."""
    base = _setting("CTRLRUN_DOCS_URL")
    if not base:
        return None
    base = str(base)
    return (base if base.endswith("/") else base + "/") + page


def environment() -> str:
    """The deployment's environment, else ``production`` (a loaded policy's own ``environment:``
    is on ``Policy.environment``, which is what actions are stamped with)."""
    return environment_override() or "production"


def _positive_seconds(name: str, default: int) -> dt.timedelta:
    value = _setting(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidArgument(f"settings.{name} must be a positive number of seconds, got {value!r}")
    return dt.timedelta(seconds=value)


def lease() -> dt.timedelta:
    return _positive_seconds("CTRLRUN_LEASE_SECONDS", DEFAULT_LEASE_SECONDS)


def approval_ttl() -> dt.timedelta:
    return _positive_seconds("CTRLRUN_APPROVAL_TTL_SECONDS", DEFAULT_APPROVAL_TTL_SECONDS)


#: How often ``wait=True`` asks the store whether a human answered: quick enough to feel live,
#: slow enough that a waiting agent costs the database two reads a second.
DEFAULT_APPROVAL_POLL_SECONDS = 0.5


def approver_roles_from() -> str:
    """What an ``approver_role`` names: ``"groups"`` (a Django group, the default) or
    ``"permissions"`` (a permission ``app_label.codename``); ``settings.CTRLRUN_APPROVER_ROLES``."""
    value = _setting("CTRLRUN_APPROVER_ROLES", "groups")
    if value not in ("groups", "permissions"):
        raise InvalidArgument(f"settings.CTRLRUN_APPROVER_ROLES must be 'groups' or 'permissions', got {value!r}")
    return value


def console_verifies() -> bool:
    """Whether this process's Django project has a surface that verifies approvers (§D5): ctrlrun's
    console, i.e. the Django admin with ``django.contrib.auth`` installed, which knows ``request.user``.
    A plain script on the embedded store (``INSTALLED_APPS = ["ctrlrun"]``) has none."""
    from django.apps import apps

    return apps.is_installed("django.contrib.admin") and apps.is_installed("django.contrib.auth")


def webhook_secret_file() -> Path | None:
    """The file holding the webhook answers' shared secret (``CTRLRUN_WEBHOOK_SECRET_FILE``); None
    leaves it to ``$CTRLRUN_WEBHOOK_SECRET`` (``ctrlrun.webhook.webhook_secret``)."""
    configured = _setting("CTRLRUN_WEBHOOK_SECRET_FILE")
    return Path(configured) if configured else None


def jsonl_directory() -> Path | None:
    """Where the process-wide JSONL sink writes ``receipts.jsonl`` and ``events.jsonl``
    (``CTRLRUN_JSONL_DIR``, else ``$CTRLRUN_JSONL_DIR``); None: no such sink (the default)."""
    configured = _setting("CTRLRUN_JSONL_DIR")
    if configured:
        return Path(configured)
    from_env = _env("CTRLRUN_JSONL_DIR")
    return Path(from_env) if from_env else None


#: A signed webhook answer is accepted for five minutes either side of its timestamp.
DEFAULT_WEBHOOK_REPLAY_WINDOW_SECONDS = 300


def webhook_replay_window() -> float:
    return _positive_seconds("CTRLRUN_WEBHOOK_REPLAY_WINDOW_SECONDS", DEFAULT_WEBHOOK_REPLAY_WINDOW_SECONDS).total_seconds()


def require_approved_policy() -> bool:
    """``settings.CTRLRUN_REQUIRE_APPROVED_POLICY`` (default False): every call first needs a policy
    approved through ``policy propose`` (§D7). Set in code, never in the policy file."""
    value = _setting("CTRLRUN_REQUIRE_APPROVED_POLICY", False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"settings.CTRLRUN_REQUIRE_APPROVED_POLICY must be True or False, got {value!r}")
    return value


def approval_poll() -> dt.timedelta:
    return _positive_seconds("CTRLRUN_APPROVAL_POLL_SECONDS", DEFAULT_APPROVAL_POLL_SECONDS)


#: Threads that run the store's phases for async calls. Each holds one database connection, so this
#: bounds the connections an event loop full of protected calls opens; a phase is a millisecond or
#: two, so a few threads keep hundreds of concurrent calls moving.
DEFAULT_ASYNC_THREADS = 4


def async_threads() -> int:
    value = _setting("CTRLRUN_ASYNC_THREADS", DEFAULT_ASYNC_THREADS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"settings.CTRLRUN_ASYNC_THREADS must be a whole number of threads (1 or more), "
                              f"got {value!r}")
    return value


def reconcile_backoff() -> tuple[dt.timedelta, dt.timedelta]:
    """(first delay, cap) for asking a hook again after it answered unknown or raised."""
    return (
        _positive_seconds("CTRLRUN_RECONCILE_BACKOFF_SECONDS", DEFAULT_BACKOFF_SECONDS),
        _positive_seconds("CTRLRUN_RECONCILE_BACKOFF_MAX_SECONDS", DEFAULT_BACKOFF_MAX_SECONDS),
    )


#: A day: the front page turns the chain tile to a warning when the last recorded check is older.
#: Long enough for a nightly full check, short enough that a check job that stopped shows the next day.
DEFAULT_CHAIN_CHECK_MAX_AGE_SECONDS = 86400


def chain_check_max_age() -> dt.timedelta:
    """``CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS``: how old the last chain check may be before the console warns."""
    return _positive_seconds("CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS", DEFAULT_CHAIN_CHECK_MAX_AGE_SECONDS)


#: Clock skew (PostgreSQL, where the store's clock is the database server's): a host whose clock disagrees
#: with the database's by more than the threshold records ``CLOCK_SKEW_DETECTED`` once per episode. One
#: second, the reference's default (well under the default lease); measured at most once a minute a process.
DEFAULT_CLOCK_SKEW_THRESHOLD_SECONDS = 1
DEFAULT_CLOCK_SKEW_INTERVAL_SECONDS = 60


def clock_skew_threshold() -> dt.timedelta:
    """``CTRLRUN_CLOCK_SKEW_THRESHOLD_SECONDS``: how far a host's clock may be from the database's (no value disables it)."""
    return _positive_seconds("CTRLRUN_CLOCK_SKEW_THRESHOLD_SECONDS", DEFAULT_CLOCK_SKEW_THRESHOLD_SECONDS)


def clock_skew_interval() -> dt.timedelta:
    """``CTRLRUN_CLOCK_SKEW_INTERVAL_SECONDS``: a process compares its clock with the database's at most this often."""
    return _positive_seconds("CTRLRUN_CLOCK_SKEW_INTERVAL_SECONDS", DEFAULT_CLOCK_SKEW_INTERVAL_SECONDS)


#: Ten minutes: a paused run claimed longer ago than this, and still ``resuming``, may be released by a
#: person (``resume_runs --release``): its process most likely died. A resumer that really takes
#: longer needs a larger value, or it can be released while it still runs.
DEFAULT_RESUME_RELEASE_AFTER_SECONDS = 600


def resume_release_after() -> dt.timedelta:
    """``CTRLRUN_RESUME_RELEASE_AFTER_SECONDS``: how old a claim must be before a person may release it."""
    return _positive_seconds("CTRLRUN_RESUME_RELEASE_AFTER_SECONDS", DEFAULT_RESUME_RELEASE_AFTER_SECONDS)


#: SQLite stores: a background thread checkpoints the WAL this often (``store.checkpoint``), so that
#: no call's COMMIT pays for it; sooner while the WAL grows fast.
DEFAULT_SQLITE_CHECKPOINT_SECONDS = 0.2


def sqlite_checkpoint_seconds() -> float | None:
    """``CTRLRUN_SQLITE_CHECKPOINT_SECONDS`` (setting, else the variable): how often the background
    checkpointer of a SQLite store runs; 0 turns it off (SQLite's own automatic checkpoint, inside
    the commit that crosses 1000 WAL pages, as before). None when off."""
    value: object = _setting("CTRLRUN_SQLITE_CHECKPOINT_SECONDS")
    name = "settings.CTRLRUN_SQLITE_CHECKPOINT_SECONDS"
    if value is None:
        value = _env("CTRLRUN_SQLITE_CHECKPOINT_SECONDS")
        name = "CTRLRUN_SQLITE_CHECKPOINT_SECONDS"
        if value is None:
            return DEFAULT_SQLITE_CHECKPOINT_SECONDS
        try:
            value = float(value)
        except ValueError:
            value = str(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise InvalidArgument(f"{name} must be a number of seconds (0 turns the background checkpointer off), "
                              f"got {value!r}")
    return float(value) or None


_alias: str | None = None
#: The clock of the ``Control`` whose call is running in this context (``Control.scope``): several
#: Controls in one process each keep their own time.
_scoped_clock: ContextVar[Callable[[], dt.datetime] | None] = ContextVar("ctrlrun_clock", default=None)


def database_alias() -> str:
    """Which ``DATABASES`` entry holds ctrlrun's tables (``default`` unless told otherwise).

    Read on every store call, so it is cached; a changed setting (tests) clears the cache. A
    Control with a database of its own runs its phases under ``store.using(alias)``.
    """
    global _alias
    if _alias is None:
        _alias = _setting("CTRLRUN_DATABASE", "default")
    return _alias


@contextlib.contextmanager
def scoped_clock(clock: Callable[[], dt.datetime] | None) -> Iterator[None]:
    """Inside the block, the store uses ``clock`` (None: the process-wide one)."""
    token = _scoped_clock.set(clock)
    try:
        yield
    finally:
        _scoped_clock.reset(token)


_pg_prepare: bool | None = None
_SWITCH_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
                 "off": False}


def pg_prepare() -> bool:
    """``CTRLRUN_PG_PREPARE`` (setting, else the variable; on unless set off): whether the store's own
    statements go to PostgreSQL server-side bound and prepared (``store.postgresql.driver_cursor``).
    Off for a pooler that cannot keep prepared statements (PgBouncer in transaction mode before 1.21,
    or without ``max_prepared_statements``). Read on every store call, so it is cached like the alias."""
    global _pg_prepare
    if _pg_prepare is None:
        configured = _setting("CTRLRUN_PG_PREPARE")
        if configured is None:
            text = _env("CTRLRUN_PG_PREPARE")
            configured = True if text is None else _SWITCH_WORDS.get(text.lower())
            if configured is None:
                raise InvalidArgument(f"CTRLRUN_PG_PREPARE must be on or off (1/0, true/false, yes/no), got {text!r}")
        elif not isinstance(configured, bool):
            raise InvalidArgument(f"settings.CTRLRUN_PG_PREPARE must be True or False, got {configured!r}")
        _pg_prepare = configured
    return _pg_prepare


def forget_cached_settings(**_: Any) -> None:
    global _alias, _pg_prepare
    _alias = None
    _pg_prepare = None


def tools_module() -> str | None:
    """The module name imported from every installed app to find reconcile hooks (``tools``)."""
    return _setting("CTRLRUN_TOOLS_MODULE", "tools") or None


def identity_provider() -> Any:
    """The default Control's identity provider: ``CTRLRUN_IDENTITY_PROVIDER``, the dotted path of a
    provider class (or factory) called with no arguments, e.g.
    ``"ctrlrun.middleware.DjangoRequestIdentityProvider"``; None (the default) for ``context()`` alone."""
    path = _setting("CTRLRUN_IDENTITY_PROVIDER")
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise InvalidArgument("CTRLRUN_IDENTITY_PROVIDER must be the dotted path of an identity provider class, "
                              "e.g. 'ctrlrun.middleware.DjangoRequestIdentityProvider'")
    from django.utils.module_loading import import_string

    try:
        factory = import_string(path.strip())
    except ImportError as exc:
        raise InvalidArgument(f"CTRLRUN_IDENTITY_PROVIDER={path!r} cannot be imported ({exc}); name a class such "
                              f"as 'ctrlrun.middleware.DjangoRequestIdentityProvider'") from None
    return factory()


def hook_modules() -> list[str]:
    """Extra dotted modules to import so their reconcile hooks are found by ``reconcile``."""
    return list(_setting("CTRLRUN_HOOK_MODULES", []))


def _system_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


_clock: Callable[[], dt.datetime] = _system_now


def now() -> dt.datetime:
    """This host's current time, aware UTC (or the test clock set with :func:`set_clock`).

    Leases, expiries and every time the store writes come from the *store's* clock instead
    (``store.now()``: the database's on PostgreSQL), so one host's clock running fast or slow
    cannot lapse a live lease or misdate evidence. A clock set here replaces both.
    """
    scoped = _scoped_clock.get()
    return scoped() if scoped is not None else _clock()


def clock_overridden() -> bool:
    """Whether a test clock replaces the system's (and so the database's) clock."""
    return _clock is not _system_now or _scoped_clock.get() is not None


def set_clock(clock: Callable[[], dt.datetime] | None) -> None:
    """Replace the clock (``None`` restores the system clock)."""
    global _clock
    _clock = clock or _system_now
