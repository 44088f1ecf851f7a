"""How a moment is written: for the evidence (``evidence_time``, imported by the wording in
``messages`` and the canonical forms alike, so neither needs the other for it), and for people
(``when_text``, the console's and the commands' one format)."""
from __future__ import annotations

import datetime as dt

__all__ = ["evidence_time", "when_text"]


def evidence_time(moment: dt.datetime | None) -> str | None:
    """UTC with milliseconds and a ``Z``: ``2026-11-29T17:21:57.420Z``."""
    if moment is None:
        return None
    moment = moment.astimezone(dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def when_text(moment: dt.datetime | None) -> str:
    """A moment for people: UTC to the second, with the zone (``2026-12-01 07:53:12 UTC``); ``-`` for none."""
    if moment is None:
        return "-"
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
