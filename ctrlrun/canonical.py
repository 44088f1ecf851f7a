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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import EffectKeyError, InvalidArgument
from .times import evidence_time

__all__ = [
    "ACTION_SCHEMA",
    "GENESIS_HASH",
    "MAX_ARGUMENTS_SIZE",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "canonical_bytes",
    "sha256_hash",
    "canonical_arguments",
    "new_id",
    "Principal",
    "Action",
    "Template",
    "strict_equal",
    "idempotency_token_for",
    "evidence_time",
    "evidence_text",
]

ACTION_SCHEMA = "ctrlrun.action/v1"
GENESIS_HASH = "sha256:" + "0" * 64
DEFAULT_ENVIRONMENT = "production"


#: Containers (lists, mappings) one argument may nest inside one another. Real arguments (a
#: payment, line items with metadata) nest a handful of levels; 64 is far beyond that, yet keeps
#: this walk, json's encoder and every json.loads that reads the evidence back far below Python's
#: recursion limit (1000) even when the call is made deep in a stack, and keeps the path in an
#: error message short enough to read.
MAX_DEPTH = 64
#: The documents hashed through canonical_bytes embed arguments two levels down (the action and
#: the receipt hold ``{"arguments": {name: value}}``); 8 more levels leave room for one more
#: envelope, so a document built from accepted arguments is never refused.
MAX_DOCUMENT_DEPTH = MAX_DEPTH + 8
#: Decimal digits an int may have. CPython refuses to write an int with more digits than the
#: process's int_max_str_digits: 4300 by default, but a process may lower it to 640, the least it
#: accepts. At 640 every process can write (and json.loads back) every accepted int, whatever its
#: setting, so all agree on the bytes. An amount in minor units needs 20 digits at most (2**64).
MAX_INT_DIGITS = 640
_INT_BOUND = 10**MAX_INT_DIGITS  # |n| < _INT_BOUND exactly when n has at most MAX_INT_DIGITS digits
_SMALL_INT = 2**64  # below this an int needs no digit count: it is a value like any other
#: How large one call's arguments may be, measured as a lower bound of their canonical JSON: 2
#: per list item and 5 per mapping item (separator, key quotes, colon, a value of at least one
#: byte), plus the UTF-8 bytes of every string and key and the digits of ints beyond 2**64. The
#: arguments are copied into the ACTION_PROPOSED event, the receipt and any approval request, and
#: hashed on every call: 1 MiB bounds that evidence and that work, and arguments whose JSON fits
#: in 1 MiB always pass. A larger blob belongs in object storage, passed by reference.
MAX_ARGUMENTS_SIZE = 1024 * 1024
#: canonical_bytes has no size limit of its own: its documents are built from bounded parts.
_UNLIMITED = 2**62


class _Refusal(Exception):
    """A value that cannot be canonicalised; turned into InvalidArgument at the top of the walk.

    The path is collected only while the refusal unwinds (innermost segment first), so the walk
    formats no path for the values that are fine. ``containers`` (only for a refusal on depth)
    holds the containers on the path, innermost first, to tell a cycle from a value that is
    merely too deep: every cycle ends there, since it is infinitely deep.
    """

    def __init__(self, describe: Callable[[str], str], *, deep: Any = None) -> None:
        super().__init__()
        self.describe = describe
        self.segments: list[str] = []
        self.containers: list[Any] | None = None if deep is None else [deep]

    def passing(self, segment: str, container: Any) -> _Refusal:
        """Note the container the refusal unwinds through and the segment that led into it."""
        self.segments.append(segment)
        if self.containers is not None:
            self.containers.append(container)
        return self

    def message(self, root: str) -> str:
        segments = self.segments[::-1]
        if self.containers is not None:
            seen: dict[int, int] = {}
            for index, container in enumerate(reversed(self.containers)):  # containers[k]: root + segments[:k]
                earlier = seen.setdefault(id(container), index)
                if earlier != index:
                    here, there = root + "".join(segments[:index]), root + "".join(segments[:earlier])
                    return (f"{here} refers to itself (it is the same object as {there}): a value that "
                            f"contains itself has no JSON form; pass a copy without the back-reference")
        return self.describe(root + "".join(segments))


class _Walk:
    """One canonicalisation's limits: how many containers may nest, how much size is left."""

    __slots__ = ("left", "levels", "max_depth")

    def __init__(self, max_depth: int, levels: int, size: int) -> None:
        self.max_depth = max_depth  # a container with this many containers around it is refused
        self.levels = levels  # the same limit as the user sees it, for the message
        self.left = size


def _segment(key: str) -> str:
    """How a key shows in a path: ``.name``, or ``['odd\\n key']`` shortened when it is unprintable or long."""
    return f".{key}" if len(key) <= 40 and key.isprintable() else f"[{_shown(key)}]"


def _shown(value: Any) -> str:
    """A short, printable, UTF-8-safe description of a value for an error message; never raises."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any failure of a hostile __repr__ (or an int too long to write)
        return f"<{type(value).__name__}>"
    text = text if len(text) <= 60 else text[:57] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _utf8_size(text: str, key: bool) -> int:
    """The UTF-8 length of a non-ASCII exact str; a lone surrogate is refused."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        advice = "decode bytes with errors='replace', or pass them as hex or base64"
        if key:
            raise _Refusal(lambda path: f"the mapping at {path}: key {_shown(text)} holds a lone surrogate, "
                                        f"which cannot be encoded as UTF-8; {advice}") from None
        raise _Refusal(lambda path: f"the string at {path} cannot be encoded as UTF-8 (it holds a lone "
                                    f"surrogate: {_shown(text)}); {advice}") from None


def _too_deep(container: Any, walk: _Walk) -> _Refusal:
    return _Refusal(lambda path: f"{path} is nested deeper than {walk.levels} levels of lists and mappings; "
                                 f"flatten it", deep=container)


def _too_big(path: str) -> str:
    return (f"arguments are larger than {MAX_ARGUMENTS_SIZE // (1024 * 1024)} MiB (counting their values and the "
            f"bytes of their strings and keys), exceeded at {path}: pass large data by reference (an id or a URL)")


def _plain(value: Any, depth: int, walk: _Walk) -> Any:
    """A plain JSON-ready copy of ``value``: exact str/int/bool/None, lists, str-keyed dicts.

    ``depth`` counts the containers around ``value``. The exact types cost one ``type()``
    comparison each; subclasses, other mappings and refusals go through :func:`_plain_other`.
    """
    kind = type(value)
    if kind is str:
        walk.left -= len(value) if value.isascii() else _utf8_size(value, False)
        if walk.left < 0:
            raise _Refusal(_too_big)
        return value
    if kind is int:
        if -_SMALL_INT < value < _SMALL_INT:
            return value
        return _large_int(value, walk)
    if value is None or kind is bool:
        return value
    if kind is dict:
        return _plain_mapping(value, value.items(), len(value), depth, walk)
    if kind is list or kind is tuple:
        return _plain_sequence(value, depth, walk)
    return _plain_other(value, kind, depth, walk)


def _plain_mapping(mapping: Any, pairs: Any, count: int, depth: int, walk: _Walk) -> dict[str, Any]:
    if depth >= walk.max_depth:
        raise _too_deep(mapping, walk)
    walk.left -= 5 * count
    if walk.left < 0:
        raise _Refusal(_too_big)
    plain: dict[str, Any] = {}
    for key, item in pairs:
        if type(key) is not str:
            key = _plain_key(key)
        walk.left -= len(key) if key.isascii() else _utf8_size(key, True)
        try:
            plain[key] = _plain(item, depth + 1, walk)
        except _Refusal as refusal:
            raise refusal.passing(_segment(key), mapping) from None
    if len(plain) != count:
        raise _collision(mapping)
    return plain


def _plain_sequence(sequence: Any, depth: int, walk: _Walk) -> list[Any]:
    if depth >= walk.max_depth:
        raise _too_deep(sequence, walk)
    walk.left -= 2 * len(sequence)
    if walk.left < 0:
        raise _Refusal(_too_big)
    items: list[Any] = []
    append = items.append
    for item in sequence:
        try:
            append(_plain(item, depth + 1, walk))
        except _Refusal as refusal:
            raise refusal.passing(f"[{len(items)}]", sequence) from None
    return items


def _plain_key(key: Any) -> str:
    """A mapping key made an exact str (see :func:`_plain_other`), or a refusal."""
    if issubclass(type(key), str):
        return str.__str__(key)
    raise _Refusal(lambda path: f"mapping keys must be strings; {path} has a {type(key).__name__} key {_shown(key)}")


def _collision(mapping: Any) -> _Refusal:
    """Two keys of ``mapping`` that became one exact str (or a mapping that listed one key twice)."""
    seen: dict[str, Any] = {}
    for key in mapping.keys():  # noqa: SIM118 - a Mapping need not iterate as its keys()
        plain = key if type(key) is str else _plain_key(key)
        if plain in seen:
            first = seen[plain]
            problem = (f": keys {_shown(first)} ({type(first).__name__}) and {_shown(key)} ({type(key).__name__}) "
                       f"both become {_shown(plain)} as plain strings; keep only one of them")
            break
        seen[plain] = key
    else:
        problem = " changed while it was read; pass a plain dict"
    return _Refusal(lambda path: f"the mapping at {path}{problem}")


def _large_int(value: int, walk: _Walk) -> int:
    """An exact int of at least 2**64 in magnitude: refused beyond MAX_INT_DIGITS, else sized by its digits."""
    if not -_INT_BOUND < value < _INT_BOUND:
        raise _Refusal(lambda path: f"the int at {path} has more than {MAX_INT_DIGITS} digits "
                                    f"({value.bit_length()} bits); pass it as a decimal string")
    walk.left -= (value.bit_length() - 1) * 3 // 10  # no more than its decimal digits: log10(2) > 0.3
    return value


def _plain_other(value: Any, kind: type, depth: int, walk: _Walk) -> Any:
    """The rare cases: str/int subclasses (made exact), other sequences and mappings, refusals.

    A subclass is converted with the base type's own slot, ``str.__str__`` / ``int.__int__``: for
    a subclass instance CPython copies the underlying value into an exact str/int and calls
    nothing the subclass could override (its ``__str__``, ``__format__``, ``__int__`` or
    ``__index__``). ``type()``, not ``isinstance``, decides, so an object that merely claims a
    type through ``__class__`` is refused as what it really is.
    """
    if issubclass(kind, str):
        return _plain(str.__str__(value), depth, walk)
    if issubclass(kind, int):  # bool is not among them: it cannot be subclassed, and is handled before
        return _plain(int.__int__(value), depth, walk)
    if kind is float:
        raise _Refusal(lambda path: f"float is not an allowed argument type at {path}: use integer minor units "
                                    f"(amount=200000) or a decimal string ('2000.00')")
    if issubclass(kind, (list, tuple)):
        return _plain_sequence(value, depth, walk)
    if issubclass(kind, Mapping):
        pairs = list(value.items())  # read once, so the count and the copy agree
        return _plain_mapping(value, pairs, len(pairs), depth, walk)
    raise _Refusal(lambda path: f"{kind.__name__} is not an allowed argument type at {path}: use str, int, bool, "
                                f"None, lists and string-keyed mappings of those")


def _check_jsonable(value: Any, path: str, walk: _Walk | None = None) -> Any:
    """Return a plain JSON-ready copy of ``value`` or raise InvalidArgument naming ``path``.

    Without ``walk`` the limits are those of a document (:data:`MAX_DOCUMENT_DEPTH`, no size).
    """
    walk = walk or _Walk(MAX_DOCUMENT_DEPTH, MAX_DOCUMENT_DEPTH, _UNLIMITED)
    try:
        plain = _plain(value, 0, walk)
    except _Refusal as refusal:
        raise InvalidArgument(refusal.message(path)) from None
    if walk.left < 0:
        raise InvalidArgument(_too_big(path))
    return plain


#: The canonical encoder, built once (``json.dumps`` with these options builds one per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_bytes(value: Any) -> bytes:
    """The one byte form everything hashed goes through: sorted keys, no spaces, raw UTF-8."""
    plain = _check_jsonable(value, "value")
    return _CANONICAL.encode(plain).encode("utf-8")


def trusted_canonical_bytes(value: Any) -> bytes:
    """:func:`canonical_bytes` for a value this process built from validated parts (no re-check)."""
    return _CANONICAL.encode(value).encode("utf-8")


def sha256_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_arguments(arguments: Mapping[str, Any], *, what: str = "arguments") -> dict[str, Any]:
    """Validate call arguments and return a fresh plain copy (tuples become lists, subclasses exact).

    Limits: :data:`MAX_DEPTH` nested containers in one argument, ints of :data:`MAX_INT_DIGITS`
    digits, :data:`MAX_ARGUMENTS_SIZE` in all; a value that contains itself is refused. ``what`` is
    the name an error's path starts with (a precondition's ``state``).
    """
    if not isinstance(arguments, Mapping):
        raise InvalidArgument(f"{what} must be a mapping of name to value, not {type(arguments).__name__}")
    # The arguments mapping is the one container around each argument's value.
    return _check_jsonable(arguments, what, _Walk(MAX_DEPTH + 1, MAX_DEPTH, MAX_ARGUMENTS_SIZE))


def new_id(prefix: str) -> str:
    """``act_``/``ctr_``/``apr_`` + 32 lowercase hex characters from 16 random bytes."""
    return prefix + secrets.token_hex(16)


@dataclass(frozen=True)
class Principal:
    """Who is acting. Only ``agent`` and ``user`` are part of the action hash: ``claims`` (values a
    verified credential carried), ``issuer`` and ``expires_at`` (an aware datetime) are evidence in
    the receipt's ``principal``, and the expiry is checked before anything else is decided."""

    agent: str
    user: str | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)
    issuer: str | None = None
    expires_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "agent", _exact_str(self.agent))
        object.__setattr__(self, "user", _exact_str(self.user))
        if type(self.agent) is not str or not self.agent.strip():
            raise InvalidArgument("a principal needs a non-empty agent name, e.g. context(agent='refund-agent')")
        if self.user is not None and (type(self.user) is not str or not self.user.strip()):
            raise InvalidArgument("user must be None or a non-empty string")
        for what, value in (("agent", self.agent), ("user", self.user)):
            if value is not None:
                check_name(value, what)
        if self.claims or self.issuer is not None or self.expires_at is not None:
            _check_credential(self)

    def expired(self, now: dt.datetime) -> bool:
        """Whether the credential this principal came from has expired by ``now``."""
        return self.expires_at is not None and self.expires_at <= now

    def as_evidence(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "user": self.user,
            "claims": dict(self.claims),
            "issuer": self.issuer,
            "expires_at": evidence_time(self.expires_at),
        }


def _check_credential(principal: Principal) -> None:
    """A principal's claims, issuer and expiry: JSON claim values, a string issuer, an aware time."""
    claims, issuer, expires = principal.claims, principal.issuer, principal.expires_at
    if not isinstance(claims, Mapping):
        raise InvalidArgument(f"principal.claims must be a mapping of claim name to value, not {type(claims).__name__}")
    object.__setattr__(principal, "claims", MappingProxyType(_check_jsonable(dict(claims), "principal.claims")))
    if issuer is not None:
        issuer = _exact_str(issuer)
        if type(issuer) is not str or not issuer.strip():
            raise InvalidArgument("principal.issuer must be None or a non-empty string")
        if "\x00" in issuer or len(issuer) > 2048:
            raise InvalidArgument("principal.issuer must be at most 2048 characters, with no NUL character")
        object.__setattr__(principal, "issuer", _check_jsonable(issuer, "principal.issuer"))
    if expires is not None and (not isinstance(expires, dt.datetime) or expires.utcoffset() is None):
        raise InvalidArgument("principal.expires_at must be a timezone-aware datetime (or None); a naive one names "
                              "no instant a clock can be compared with")


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
        if type(self.name) is not str:
            object.__setattr__(self, "name", _exact_str(self.name))
        if type(self.name) is not str or not self.name:
            raise InvalidArgument("an action needs a non-empty name")
        check_name(self.name, "an action name")
        if not isinstance(self.arguments, Mapping):
            raise InvalidArgument("an action's arguments must be a mapping of name to value")
        object.__setattr__(self, "arguments", canonical_arguments(self.arguments))
        # Everything hashed is checked here, so the hash (trusted bytes) can never fail later.
        resource, environment = self.resource, self.environment
        if resource is not None and not (type(resource) is str and resource.isascii()):
            object.__setattr__(self, "resource", _check_jsonable(resource, "resource"))
        if not (type(environment) is str and environment.isascii()):
            object.__setattr__(self, "environment", _check_jsonable(environment, "environment"))

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
    def canonical_json(self) -> str:
        """:meth:`canonical` as its canonical JSON text (computed once; the hash is taken over it)."""
        cached = self.__dict__.get("_canonical_json")
        if cached is None:
            cached = _CANONICAL.encode(self.canonical())  # arguments checked at init
            object.__setattr__(self, "_canonical_json", cached)
        return cached

    @property
    def hash(self) -> str:
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = sha256_hash(self.canonical_json.encode("utf-8"))
            object.__setattr__(self, "_hash", cached)
        return cached


#: Names (agents, users, actions) are stored in 200-character columns on every database.
MAX_NAME_LENGTH = 200


def _exact_str(value: Any) -> Any:
    """An exact str for a str subclass (``str.__str__`` copies its text, calling no override); else ``value``."""
    return str.__str__(value) if type(value) is not str and issubclass(type(value), str) else value


def check_name(value: str, what: str) -> None:
    """Refuse a name the store would take differently on SQLite and PostgreSQL."""
    value = _exact_str(value)
    if type(value) is not str:
        raise InvalidArgument(f"{what} must be a string, not {type(value).__name__}")
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
            kind = type(value)  # not isinstance: an object claiming str through __class__ is not one
            if kind is bool or not issubclass(kind, (str, int)):
                raise error(
                    f"{self.text!r}: '{{{piece}}}' is {kind.__name__}; a placeholder must "
                    f"resolve to a non-empty string or an int"
                )
            # The exact value, as canonicalisation makes it (see _plain_other): a subclass's
            # __str__/__format__/__repr__ never decides the key.
            if issubclass(kind, str):
                text = str.__str__(value)
            else:
                number = int.__int__(value)
                if not -_INT_BOUND < number < _INT_BOUND:
                    raise error(
                        f"{self.text!r}: '{{{piece}}}' is an int of more than {MAX_INT_DIGITS} digits; "
                        f"pass it as a decimal string"
                    )
                text = int.__repr__(number)
            if text == "":
                raise error(
                    f"{self.text!r}: '{{{piece}}}' is empty; a placeholder must resolve to a "
                    f"non-empty string or an int"
                )
            out.append(text)
        rendered = "".join(out)
        if "\x00" in rendered:
            raise error(f"{self.text!r} renders a key with a NUL character, which PostgreSQL cannot store")
        if len(rendered) > MAX_KEY_LENGTH:
            raise error(f"{self.text!r} renders {len(rendered)} characters; at most {MAX_KEY_LENGTH} are allowed")
        if not rendered.isascii():
            try:
                rendered.encode("utf-8")
            except UnicodeEncodeError:
                raise error(
                    f"{self.text!r} renders a key with a lone surrogate ({_shown(rendered)}), which cannot be "
                    f"stored as UTF-8 text; decode bytes with errors='replace'"
                ) from None
        return rendered


def _uuid_from(document: dict[str, Any]) -> str:
    digest = bytearray(hashlib.sha256(canonical_bytes(document)).digest()[:16])
    digest[6] = digest[6] & 0x0F | 0x80
    digest[8] = digest[8] & 0x3F | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def idempotency_token_for(effect_key: str, attempt: int | None = None) -> str:
    """A UUID-shaped token to hand to the remote's idempotency header.

    Without ``attempt`` it is stable for the effect key across attempts: the fence that turns a
    late call from a worker that outlived its lease into a replay of the first at a remote that
    dedupes on the token (a deliberate departure from the reference). With ``attempt`` it is the
    reference's per-attempt value (``("tok:t1", 1)`` -> ``497c20d6-d847-8d19-8c14-fe31f5c9aeca``).
    """
    if attempt is None:
        return _uuid_from({"schema": "ctrlrun.idempotency/v2", "effect_key": effect_key})
    return _uuid_from({"schema": "ctrlrun.idempotency/v1", "effect_key": effect_key, "attempt": attempt})


def evidence_text(text: str) -> str:
    """Text safe to store: a lone surrogate (e.g. bytes decoded with surrogateescape in an
    exception message) becomes a visible backslash escape instead of failing the write."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def strict_equal(left: Any, right: Any) -> bool:
    """Type-strict, recursive equality: ``True != 1``, ``"1" != 1``, lists by order, maps by keys.

    Python's ``==`` says ``True == 1`` and ``1 == 1.0``; a policy that allows ``approved_eq:
    true`` must not be satisfied by ``approved=1``. Tuples count as lists because the canonical
    form of an argument turns tuples into lists.
    """
    if isinstance(left, (list, tuple)):
        return (
            isinstance(right, (list, tuple))
            and len(left) == len(right)
            and all(strict_equal(a, b) for a, b in zip(left, right))
        )
    if isinstance(left, Mapping):
        if not isinstance(right, Mapping) or len(left) != len(right):
            return False
        for key, value in left.items():
            if key not in right or not strict_equal(value, right[key]):
                return False
        return True
    if isinstance(right, (list, tuple, Mapping)):
        return False  # a container never equals a scalar
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right  # both bools and the same one (bools are singletons)
    if isinstance(left, int):
        return isinstance(right, int) and left == right
    if isinstance(left, str):
        return isinstance(right, str) and left == right
    return type(left) is type(right) and left == right
