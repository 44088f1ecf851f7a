"""System checks: ``manage.py check`` loads the policy and reports what is wrong with it."""
from __future__ import annotations

from typing import Any

from django.core import checks

from . import conf
from .errors import CTRLRunError


@checks.register()
def check_policy(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A malformed policy is an error naming file, line and key; a missing one a warning."""
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
        load_policy(path, environment=conf.environment())
    except CTRLRunError as exc:
        return [checks.Error(str(exc), hint="fix the policy file, then run the check again", id="ctrlrun.E002")]
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
