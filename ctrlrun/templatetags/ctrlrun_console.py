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
    if policy is None or not policy.observing:
        return {"observing": False}
    from ..console import change_url

    return {"observing": True, "policy_url": change_url("admin", "policydocument", policy.hash)
            if _stored(policy.hash) else None,
            "policy_file": policy.source, "docs_url": conf.docs_url("console.md#observe-mode")}


def _stored(policy_hash: str) -> bool:
    """Whether the store holds the policy (it does once a call was decided under it): the page to link to."""
    from .. import store
    from ..models import PolicyDocument

    try:
        return PolicyDocument.objects.using(store.alias()).filter(pk=policy_hash).exists()
    except Exception:  # noqa: BLE001 - the banner never breaks a page (a store not migrated yet, say)
        return False
