"""Preconditions (§8.6): the state of the world a person approved, as a fingerprint.

Pure: no Django. A protected call may name ``preconditions=``, a function of the ``Action``
returning a mapping: the state the person deciding looks at (``{"balance": 900}``). When an
``approve`` call asks, the state's fingerprint is stored on the request; just before the granted
approval is used, the state is read again and must have the same fingerprint, or the approval is
refused (and left granted, so the person can look again).

The fingerprint is ``sha256(canonical_bytes({"schema": "ctrlrun.precondition/v1", "state": ...}))``.
The state is held to the arguments' rules (str, int, bool, None, lists, string-keyed mappings; no
floats; 64 levels, 1 MiB) and may hold no invisible or direction-changing character: a state whose
text does not show as it is cannot stand for what a person saw. What cannot be fingerprinted is
refused with a sentence naming where and why (``precondition_unavailable``), never a traceback.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .canonical import canonical_arguments, canonical_bytes, sha256_hash
from .display import describe, is_hidden
from .errors import InvalidArgument

__all__ = ["PRECONDITION_SCHEMA", "fingerprint", "described_failure"]

PRECONDITION_SCHEMA = "ctrlrun.precondition/v1"


def fingerprint(state: Any) -> str:
    """The fingerprint of ``state``, or ``InvalidArgument`` saying what is wrong with it."""
    if not isinstance(state, Mapping):
        raise InvalidArgument(f"the preconditions function must return a mapping (the state the person approving "
                              f"sees, e.g. {{'balance': 900}}), not {type(state).__name__}")
    try:
        plain = canonical_arguments(state, what="state")
    except InvalidArgument as exc:
        raise InvalidArgument(f"the preconditions state cannot be fingerprinted: {exc}") from None
    hidden = _first_hidden(plain, "state")
    if hidden is not None:
        where, char = hidden
        raise InvalidArgument(f"the preconditions state cannot be fingerprinted: {where} holds {describe(char)}, an "
                              f"invisible or direction-changing character, so it does not show as it is; remove it "
                              f"(or pass that text hex-encoded)")
    return sha256_hash(canonical_bytes({"schema": PRECONDITION_SCHEMA, "state": plain}))


def _first_hidden(value: Any, path: str) -> tuple[str, str] | None:
    """(where, character) of the first hidden character in a plain value's strings and keys, else None."""
    if isinstance(value, str):
        char = next((c for c in value if is_hidden(c)), None)
        return (f"the string at {path}", char) if char is not None else None
    if isinstance(value, dict):
        for key, item in value.items():
            char = next((c for c in key if is_hidden(c)), None)
            if char is not None:
                return f"a key of the mapping at {path}", char
            found = _first_hidden(item, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_hidden(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def described_failure(exc: BaseException) -> str:
    """What a preconditions function that raised said, as one short line (a hostile ``__str__`` included)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - whatever an exception's own __str__ does
        text = ""
    text = "".join(c if not is_hidden(c) else "?" for c in text[:200])
    return f"the preconditions function raised {type(exc).__name__}" + (f": {text}" if text else "")
