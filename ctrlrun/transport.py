"""Placeholder until the transport classifier lands: the executor scope the kernel opens."""
from __future__ import annotations

import contextlib


def executor_scope() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()
