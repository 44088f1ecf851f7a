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
