"""The console's template tags: ``{% ctrlrun_overview %}`` (what needs a person now, for the admin's
front page), the observe-mode banner, and what ctrlrun's own templates (``admin/ctrlrun/...``) bring
to any project's admin: the console's stylesheet and a header naming ctrlrun."""
from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("admin/ctrlrun/overview.html", takes_context=True)
def ctrlrun_overview(context: Any) -> dict[str, Any]:
    """The tiles and the day's counts; with the observe-mode banner on top, for a project whose
    ``base_site.html`` does not show it (the banner appears once a page, whoever shows it first)."""
    from ..admin.frontpage import overview_context

    return {**overview_context(), "request": context.get("request")}


#: What the admin's header says on ctrlrun's pages when the project kept Django's own header.
CONSOLE_NAME = "ctrlrun console"


def _site_name(context: Any) -> str:
    from django.contrib.admin import AdminSite

    header = context.get("site_header")
    if not header or str(header) == str(AdminSite.site_header):  # Django's "Django administration"
        return CONSOLE_NAME
    return f"{header} · {CONSOLE_NAME}"


@register.simple_tag(takes_context=True)
def ctrlrun_site_name(context: Any) -> str:
    """The header of ctrlrun's pages: "ctrlrun console", or "<the project's site_header> · ctrlrun console"."""
    return _site_name(context)


@register.simple_tag
def ctrlrun_stylesheet() -> Any:
    """The console's stylesheet, linked by each of ctrlrun's templates (never left to a project's base_site)."""
    from django.templatetags.static import static
    from django.utils.html import format_html

    return format_html('<link rel="stylesheet" href="{}" id="ctrlrun-console-css">', static("ctrlrun/console.css"))


@register.filter
def console_time(moment: Any) -> Any:
    """A time in the console's one format (``2026-12-01 07:53:12 UTC``, exact time on hover)."""
    from ..admin.console import when

    return when(moment)


@register.inclusion_tag("admin/ctrlrun/observe_banner.html", takes_context=True)
def ctrlrun_observe_banner(context: Any) -> dict[str, Any]:
    """The banner every console page shows while the policy this server reads is in observe mode
    (``mode: observe``): nothing is enforced. Nothing when it enforces, or cannot be read.

    Shown once a page: ctrlrun's templates and a project's ``base_site.html`` may both ask for it
    (the request remembers it was shown)."""
    from .. import conf
    from ..admin import current_policy

    request = context.get("request")
    if request is not None and getattr(request, "_ctrlrun_banner_shown", False):
        return {"observing": False}
    policy = current_policy()
    if policy is None or not policy.observing:
        return {"observing": False}
    if request is not None:
        request._ctrlrun_banner_shown = True
    from ..admin.console import change_url

    return {"observing": True, "policy_url": change_url("admin", "policydocument", policy.hash)
            if _stored(policy.hash) else None,
            "policy_file": policy.source, "docs_url": conf.docs_url("console.md#observe-mode")}


def _stored(policy_hash: str) -> bool:
    """Whether the store holds the policy (it does once a call was decided under it): the page to link to."""
    from .. import store

    try:
        return store.policy_stored(policy_hash)
    except Exception:  # noqa: BLE001 - the banner never breaks a page (a store not migrated yet, say)
        return False
