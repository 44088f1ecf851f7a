"""``{% ctrlrun_overview %}``: what needs a person now, for the admin's front page."""
from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("admin/ctrlrun/overview.html")
def ctrlrun_overview() -> dict[str, Any]:
    from ..frontpage import overview_context

    return overview_context()


@register.filter
def console_time(moment: Any) -> Any:
    """A time in the console's one format (``2026-12-01 07:53:12 UTC``, exact time on hover)."""
    from ..console import when

    return when(moment)


@register.inclusion_tag("admin/ctrlrun/observe_banner.html")
def ctrlrun_observe_banner() -> dict[str, Any]:
    """The banner every console page shows while the policy this server reads is in observe mode
    (``mode: observe``): nothing is enforced. Nothing when it enforces, or cannot be read."""
    from .. import conf
    from ..admin import current_policy

    policy = current_policy()
    return {"observing": bool(policy is not None and policy.observing),
            "policy_hash": policy.hash if policy is not None else None,
            "docs_url": conf.docs_url("console.md#observe-mode")}
