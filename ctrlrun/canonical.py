"""Canonical bytes, hashes, ids, actions and templates: the pure vocabulary of one call.

Standard library only. Everything that is hashed goes through :func:`canonical_bytes`, so two
processes (or two implementations) that see the same action compute the same hash.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import EffectKeyError, InvalidArgument

__all__ = [
    "ACTION_SCHEMA",
    "GENESIS_HASH",
    "canonical_bytes",
    "sha256_hash",
    "canonical_arguments",
    "new_id",
    "Principal",
    "Action",
    "Template",
    "idempotency_token_for",
    "evidence_time",
    "evidence_text",
]

ACTION_SCHEMA = "ctrlrun.action/v1"
GENESIS_HASH = "sha256:" + "0" * 64
DEFAULT_ENVIRONMENT = "production"


def _check_jsonable(value: Any, path: str) -> Any:
    """Return a plain JSON-ready copy of ``value`` or raise InvalidArgument naming ``path``."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"the string at {path} cannot be encoded as UTF-8 (it holds a lone surrogate)"
            ) from None
        return value
    if isinstance(value, float):
        raise InvalidArgument(
            f"float is not an allowed argument type at {path}: use integer minor units "
            f"(amount=200000) or a decimal string ('2000.00')"
        )
    if isinstance(value, (list, tuple)):
        return [_check_jsonable(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgument(
                    f"mapping keys must be strings; {path} has a {type(key).__name__} key {key!r}"
                )
            plain[key] = _check_jsonable(item, f"{path}.{key}")
        return plain
    raise InvalidArgument(
        f"{type(value).__name__} is not an allowed argument type at {path}: use str, int, bool, "
        f"None, lists and string-keyed mappings of those"
    )


def canonical_bytes(value: Any) -> bytes:
    """The one byte form everything hashed goes through: sorted keys, no spaces, raw UTF-8."""
    plain = _check_jsonable(value, "value")
    return json.dumps(
        plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def trusted_canonical_bytes(value: Any) -> bytes:
    """:func:`canonical_bytes` for a value this process built from validated parts (no re-check)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Validate call arguments and return a fresh plain copy (tuples become lists)."""
    return {name: _check_jsonable(value, f"arguments.{name}") for name, value in arguments.items()}


def new_id(prefix: str) -> str:
    """``act_``/``ctr_``/``apr_`` + 32 lowercase hex characters from 16 random bytes."""
    return prefix + secrets.token_hex(16)


@dataclass(frozen=True)
class Principal:
    """Who is acting. Only ``agent`` and ``user`` are part of the action hash."""

    agent: str
    user: str | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)
    issuer: str | None = None
    expires_at: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.agent, str) or not self.agent.strip():
            raise InvalidArgument("a principal needs a non-empty agent name, e.g. context(agent='refund-agent')")
        if self.user is not None and (not isinstance(self.user, str) or not self.user.strip()):
            raise InvalidArgument("user must be None or a non-empty string")
        for what, value in (("agent", self.agent), ("user", self.user)):
            if value is not None:
                check_name(value, what)

    def as_evidence(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "user": self.user,
            "claims": dict(self.claims),
            "issuer": self.issuer,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True, eq=False)
class Action:
    """One proposed call: what, with which canonical arguments, by whom, where.

    Equality is by ``action_id``: two calls with the same arguments are still two actions.
    """

    name: str
    arguments: Mapping[str, Any]
    principal: Principal
    resource: str | None = None
    environment: str = DEFAULT_ENVIRONMENT
    action_id: str = field(default_factory=lambda: new_id("act_"))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument("an action needs a non-empty name")
        check_name(self.name, "an action name")
        if not isinstance(self.arguments, Mapping):
            raise InvalidArgument("an action's arguments must be a mapping of name to value")
        object.__setattr__(self, "arguments", canonical_arguments(self.arguments))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Action) and other.action_id == self.action_id

    def __hash__(self) -> int:
        return hash(self.action_id)

    def canonical(self) -> dict[str, Any]:
        return {
            "arguments": self.arguments,
            "environment": self.environment,
            "name": self.name,
            "principal": {"agent": self.principal.agent, "user": self.principal.user},
            "resource": self.resource,
            "schema": ACTION_SCHEMA,
        }

    @property
    def hash(self) -> str:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = sha256_hash(trusted_canonical_bytes(self.canonical()))  # arguments checked at init
            object.__setattr__(self, "_hash", cached)
        return cached


#: Names (agents, users, actions) are stored in 200-character columns on every database.
MAX_NAME_LENGTH = 200


def check_name(value: str, what: str) -> None:
    """Refuse a name the store would take differently on SQLite and PostgreSQL."""
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(f"{what} is {len(value)} characters; at most {MAX_NAME_LENGTH} are allowed")
    if "\x00" in value:
        raise InvalidArgument(f"{what} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} contains a lone surrogate, which cannot be stored as UTF-8 text") from None


_PLACEHOLDER = re.compile(r"\{([^\W\d]\w*)\}")
#: Longest effect key the store accepts; a key longer than this is a template mistake.
MAX_KEY_LENGTH = 1024


@dataclass(frozen=True)
class Template:
    """Literal text with ``{name}`` placeholders, e.g. ``refund:{payment_id}``."""

    text: str
    parts: tuple[tuple[str, bool], ...]  # (literal, False) or (placeholder name, True)

    @classmethod
    def parse(cls, text: Any) -> Template:
        """Parse ``text``; raise InvalidArgument describing the first problem."""
        if not isinstance(text, str) or not text:
            raise InvalidArgument(f"{text!r} is not a valid template: it must be a non-empty string")
        parts: list[tuple[str, bool]] = []
        position = 0
        while position < len(text):
            brace = min((i for i in (text.find("{", position), text.find("}", position)) if i >= 0), default=-1)
            if brace < 0:
                parts.append((text[position:], False))
                break
            if brace > position:
                parts.append((text[position:brace], False))
            match = _PLACEHOLDER.match(text, brace)
            if text[brace] == "}" or match is None:
                raise InvalidArgument(
                    f"{text!r} is not a valid template: expected literal text and '{{name}}' "
                    f"placeholders, found {text[brace]!r} at position {brace}"
                )
            parts.append((match.group(1), True))
            position = match.end()
        return cls(text, tuple(parts))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, is_name in self.parts if is_name)

    def render(self, values: Mapping[str, Any], error: type[Exception] = EffectKeyError) -> str:
        """Fill the placeholders; each value must be a non-empty str or an int (not a bool)."""
        out = []
        for piece, is_name in self.parts:
            if not is_name:
                out.append(piece)
                continue
            if piece not in values:
                have = ", ".join(sorted(values)) or "no arguments"
                raise error(f"{self.text!r}: no value for '{{{piece}}}' (have: {have})")
            value = values[piece]
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise error(
                    f"{self.text!r}: '{{{piece}}}' is {type(value).__name__}; a placeholder must "
                    f"resolve to a non-empty string or an int"
                )
            if value == "":
                raise error(
                    f"{self.text!r}: '{{{piece}}}' is empty; a placeholder must resolve to a "
                    f"non-empty string or an int"
                )
            out.append(str(value))
        rendered = "".join(out)
        if "\x00" in rendered:
            raise error(f"{self.text!r} renders a key with a NUL character, which PostgreSQL cannot store")
        if len(rendered) > MAX_KEY_LENGTH:
            raise error(f"{self.text!r} renders {len(rendered)} characters; at most {MAX_KEY_LENGTH} are allowed")
        return rendered


def idempotency_token_for(effect_key: str, attempt: int) -> str:
    """A UUID-shaped token stable for one (effect key, attempt): hand it to the remote's API."""
    digest = bytearray(
        hashlib.sha256(
            canonical_bytes({"schema": "ctrlrun.idempotency/v1", "effect_key": effect_key, "attempt": attempt})
        ).digest()[:16]
    )
    digest[6] = digest[6] & 0x0F | 0x80
    digest[8] = digest[8] & 0x3F | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def evidence_text(text: str) -> str:
    """Text safe to store: a lone surrogate (e.g. bytes decoded with surrogateescape in an
    exception message) becomes a visible backslash escape instead of failing the write."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def evidence_time(moment: dt.datetime | None) -> str | None:
    """UTC with milliseconds and a ``Z``: ``2026-11-29T17:21:57.420Z``."""
    if moment is None:
        return None
    moment = moment.astimezone(dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
