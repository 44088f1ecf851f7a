"""How evidence writes a moment: one function, imported by the wording (``messages``) and the
canonical forms alike, so neither needs the other for it."""
from __future__ import annotations

import datetime as dt

__all__ = ["evidence_time"]


def evidence_time(moment: dt.datetime | None) -> str | None:
    """UTC with milliseconds and a ``Z``: ``2026-11-29T17:21:57.420Z``."""
    if moment is None:
        return None
    moment = moment.astimezone(dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
