"""System checks: ``manage.py check`` loads the policy and reports what is wrong with it."""
from __future__ import annotations

from typing import Any

from django.core import checks

from . import conf
from .errors import CTRLRunError


@checks.register()
def check_policy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A malformed policy is an error naming file, line and key; a missing one a warning, and so is
    one in observe mode (ctrlrun.W002: nothing is enforced)."""
    from .control import default_control

    try:
        path = conf.policy_path()
    except CTRLRunError as exc:
        return [checks.Error(str(exc), id="ctrlrun.E001")]
    if not path.exists():
        return [
            checks.Warning(
                f"no policy file at {path}: every protected call will fail until one exists",
                hint="create it (schema: ctrlrun.policy/v2), or point settings.CTRLRUN_POLICY at it",
                id="ctrlrun.W001",
            )
        ]
    try:
        policy = default_control().read_policy()
    except CTRLRunError as exc:
        return [checks.Error(str(exc), hint="fix the policy file, then run the check again", id="ctrlrun.E002")]
    if policy.observing:
        return [
            checks.Warning(
                f"{path} is in observe mode (mode: observe): nothing is enforced; every protected call runs, "
                f"and receipts record what enforcement would have done",
                hint="a shadow deployment only: set 'mode: enforce' (or remove 'mode:') to refuse what the "
                     "policy denies",
                id="ctrlrun.W002",
            )
        ]
    return []


@checks.register()
def check_approved_policy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``CTRLRUN_REQUIRE_APPROVED_POLICY`` not a bool (ctrlrun.E006); on, with a policy that cannot be
    approved because it does not declare ``ctrlrun.policy.change`` deciding only ``approve``
    (ctrlrun.W006): every protected call is refused ``policy_unapproved``, and so is every proposal."""
    from .control import default_control
    from .policy.change import POLICY_CHANGE_ACTION, governs_changes

    try:
        required = conf.require_approved_policy()
    except CTRLRunError as exc:
        return [checks.Error(str(exc), id="ctrlrun.E006")]
    if not required:
        return []
    try:
        policy = default_control().read_policy()
    except (CTRLRunError, OSError):
        return []  # check_policy says what is wrong with it
    if policy.observing or governs_changes(policy):
        return []
    return [checks.Warning(
        f"CTRLRUN_REQUIRE_APPROVED_POLICY is on, and {policy.source} cannot be approved: every protected call is "
        f"refused policy_unapproved, a proposal included",
        hint=f"declare {POLICY_CHANGE_ACTION!r} with every rule deciding 'approve' (schema ctrlrun.policy/v6 or "
             f"later), then propose the policy: see docs/policy-changes.md",
        id="ctrlrun.W006")]


@checks.register()
def check_time_zone(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ctrlrun stores aware UTC times; Django must too."""
    from django.conf import settings

    if not settings.USE_TZ:
        return [
            checks.Error(
                "ctrlrun needs USE_TZ = True: leases and evidence are aware UTC times",
                id="ctrlrun.E003",
            )
        ]
    return []


@checks.register(checks.Tags.database)
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ctrlrun's store runs on SQLite or PostgreSQL (its SQL and triggers are written for both)."""
    from django.db import connections

    vendor = connections[conf.database_alias()].vendor
    if vendor not in ("sqlite", "postgresql"):
        return [checks.Error(f"ctrlrun stores its evidence on SQLite or PostgreSQL, not {vendor}",
                             hint="point settings.CTRLRUN_DATABASE at a SQLite or PostgreSQL database",
                             id="ctrlrun.E004")]
    return []


@checks.register()
def check_durations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The duration settings are positive numbers of seconds (a bad one is named at start, not on a page)."""
    problems = []
    for read in (conf.lease, conf.approval_ttl, conf.chain_check_max_age):
        try:
            read()
        except CTRLRunError as exc:
            problems.append(checks.Error(str(exc), hint="set it to a number of seconds greater than 0",
                                         id="ctrlrun.E005"))
    try:
        conf.sqlite_checkpoint_seconds()
    except CTRLRunError as exc:
        problems.append(checks.Error(str(exc), hint="set it to a number of seconds, or 0 to turn the thread off",
                                     id="ctrlrun.E005"))
    return problems


@checks.register()
def check_identity(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The identity settings (``CTRLRUN_IDENTITY_PROVIDER``, the middleware's API keys) are usable."""
    from .middleware import settings_problem

    problems = []
    try:
        conf.identity_provider()
    except CTRLRunError as exc:
        problems.append(checks.Error(str(exc), hint="see docs/identity.md", id="ctrlrun.E007"))
    problem = settings_problem()
    if problem is not None:
        problems.append(checks.Error(problem, hint="see docs/identity.md", id="ctrlrun.E007"))
    return problems


def _migrating() -> bool:
    """Whether these checks run inside ``migrate`` (which runs them first, then makes the tables): an
    instance of Django's migrate command (or a project's subclass) on the stack."""
    import sys

    from django.core.management.commands.migrate import Command as Migrate

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False


def _names(migrations: list[str]) -> str:
    if len(migrations) <= 3:
        return ", ".join(migrations)
    return f"{migrations[0]} to {migrations[-1]}"


@checks.register(checks.Tags.database)
def check_migrations(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ctrlrun's migrations not applied on its database (ctrlrun.W003): every protected call and console
    page would fail with "no such table". A warning, not an error, so ``makemigrations`` and the rest
    still run; never said inside ``migrate``. A database it cannot read is said (ctrlrun.W004), not raised.

    Run by plain ``manage.py check`` too (not only ``check --database``): that is where a project
    that added the app learns it has not migrated."""
    if _migrating():
        return []
    from django.db import connections
    from django.db.migrations.loader import MigrationLoader

    alias = conf.database_alias()
    try:
        loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
        applied = loader.applied_migrations
    except Exception as exc:  # noqa: BLE001 - a check never crashes: not reachable, not allowed, no driver
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return [checks.Warning(
            f"could not read which ctrlrun migrations are applied on the database {alias!r}: {reason}",
            hint="make the database reachable, then run `python manage.py migrate` (and the check again)",
            id="ctrlrun.W004")]
    missing = sorted(name for app, name in loader.disk_migrations if app == "ctrlrun"
                     and (app, name) not in applied)
    if not missing:
        return []
    count = f"{len(missing)} ctrlrun migration{'s' if len(missing) != 1 else ''}"
    return [checks.Warning(
        f"{count} not applied on the database {alias!r} ({_names(missing)}): every protected call and "
        f"console page will fail (no such table) until they are applied",
        hint="run `python manage.py migrate`", id="ctrlrun.W003")]


@checks.register(checks.Tags.database)
def check_guard(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The database's guard (the triggers of ``ctrlrun.guard``) missing, older than this code expects,
    short of a trigger, or newer than this code knows (ctrlrun.W005): it reads the version the guard
    records. Silent inside ``migrate``, while a ctrlrun migration is pending (W003 says so: migrating
    installs each version) and when the database cannot be read (W004 says so)."""
    if _migrating():
        return []
    from django.db import connections

    from . import guards

    alias = conf.database_alias()
    try:
        connection = connections[alias]
        if connection.vendor not in guards.VENDORS or guards.migrations_pending(connection):
            return []
        found = guards.problem(connection)
    except Exception:  # noqa: BLE001 - a check never crashes; W004 names a database it cannot read
        return []
    if found is None:
        return []
    version, missing = found
    expected = f"this code expects guard version {guards.CURRENT}"
    hint = (f"run `python manage.py migrate ctrlrun`: with every ctrlrun migration applied it puts guard version "
            f"{guards.CURRENT} back (docs/guarantees.md, guard versions)")
    if version is None:
        text = (f"the database {alias!r} records no ctrlrun guard: its triggers (append-only evidence, the state "
                f"tables, the release-only ledger) are missing or from before guards were versioned; {expected}")
    elif version > guards.CURRENT:
        text = (f"the database {alias!r} has ctrlrun guard version {version}, newer than version "
                f"{guards.CURRENT} this code knows: it was migrated by a newer ctrlrun")
        hint = "run the ctrlrun release whose migrations installed it (this code never replaces a newer guard)"
    elif missing:
        text = (f"the database {alias!r} records ctrlrun guard version {version} but lacks "
                f"{len(missing)} of its triggers ({_names(missing)}): they were dropped outside ctrlrun; {expected}")
    else:
        text = f"the database {alias!r} has ctrlrun guard version {version}, older than version {guards.CURRENT}: " \
               f"{expected}"
    return [checks.Warning(text, hint=hint, id="ctrlrun.W005")]


@checks.register(checks.Tags.database)
def check_reference_store(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ctrlrun's database also holds the reference ctrlrun's store (ctrlrun.E008): this ctrlrun keeps its
    own tables and would run again every key that one ran; its store is imported instead."""
    from django.db import connections

    from .reference_store import holds_reference_tables

    alias = conf.database_alias()
    try:
        found = holds_reference_tables(connections[alias])
    except Exception:  # noqa: BLE001 - a check never crashes; W004 names a database it cannot read
        return []
    if not found:
        return []
    return [checks.Error(
        f"the database {alias!r} holds a store written by the reference ctrlrun (PyPI 'ctrlrun': tables effects, "
        "receipts, receipt_chain): this ctrlrun keeps its own tables, so every key that store ran would run again",
        hint="give ctrlrun a database of its own and import the reference's store into it (docs/importing.md); "
             "SILENCED_SYSTEM_CHECKS = ['ctrlrun.E008'] if those tables are another application's",
        id="ctrlrun.E008")]
