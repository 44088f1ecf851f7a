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
    from .policy import load_policy

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
        policy = load_policy(path, environment=conf.environment_override(), authority=conf.authority_path())
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
    return problems
