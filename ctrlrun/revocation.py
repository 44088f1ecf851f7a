"""Credential revocation feeds: an identity provider asks one before it accepts a token.

``RevocationFeed`` is the protocol ``JWTIdentityProvider(revocations=...)`` consults:
``revoked(*, issuer, subject, token_id) -> bool``, with ``read_at`` (when the feed's contents were
last known current), ``issuers`` (the token issuers it speaks for) and ``max_staleness``.

A feed can only refuse. It answers True when the subject or the token id is revoked, and also for
**every** principal of its issuers once it is stale (``read_at`` older than ``max_staleness``, or
never read): a feed that stopped updating cannot tell who was revoked since. A token of an issuer
the feed does not speak for is not its business (False). The provider turns True into
``IdentityError("credential rejected")`` and a log line; since that happens before an Action
exists, a revoked credential leaves **no receipt** (an expired one, by contrast, is a denied receipt).

The contents are Security Event Tokens (RFC 8417), one per line: a compact JWT (its payload is
read; the feed's source is trusted as configuration, and a forged line could only refuse someone)
or the payload as a JSON object. The CAEP/RISC events read are session-revoked,
credential-change, account-credential-change-required and account-disabled; subjects in the
``iss_sub``, ``opaque`` (an id under the SET's ``iss``) and ``jwt_id`` formats. Anything else on a
line is skipped and logged.

``FileRevocationFeed(path, ...)`` reads a file again whenever it changes; its ``read_at`` is the
file's modification time, so a publisher that stopped writing makes it stale.
``PollingRevocationFeed(url, ...)`` fetches a URL at most every ``poll_interval`` (when asked, not
from a thread of its own), with a timeout and a body limit; its ``read_at`` is its last good fetch.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import threading
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import InvalidArgument

__all__ = ["RevocationFeed", "FileRevocationFeed", "PollingRevocationFeed", "Revocations", "EVENT_TYPES"]

logger = logging.getLogger("ctrlrun.identity")

_BASE = "https://schemas.openid.net/secevent/"
EVENT_TYPES = frozenset({
    _BASE + "caep/event-type/session-revoked",
    _BASE + "caep/event-type/credential-change",
    _BASE + "risc/event-type/account-credential-change-required",
    _BASE + "risc/event-type/account-disabled",
})


@runtime_checkable
class RevocationFeed(Protocol):
    issuers: frozenset[str]
    max_staleness: dt.timedelta | None

    @property
    def read_at(self) -> dt.datetime | None:
        ...

    def revoked(self, *, issuer: str, subject: str | None, token_id: str | None) -> bool:
        ...


@dataclass(frozen=True)
class Revocations:
    """What a feed's contents revoke: (issuer, subject) pairs and (issuer, token id) pairs."""

    subjects: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    token_ids: frozenset[tuple[str, str]] = field(default_factory=frozenset)


def _payload(line: str) -> Any:
    if line.startswith("{"):
        return json.loads(line)
    parts = line.split(".")
    if len(parts) != 3:
        raise ValueError("neither a JSON object nor a compact JWT")
    body = parts[1] + "=" * (-len(parts[1]) % 4)
    return json.loads(base64.urlsafe_b64decode(body.encode("ascii")))


def parse_sets(text: str, source: str) -> Revocations:
    """The revocations in ``text`` (SETs one per line); a line that is not one is logged and skipped."""
    subjects, token_ids = set(), set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            document = _payload(line)
            set_issuer, events = document.get("iss"), document["events"]
            if not isinstance(events, dict):
                raise ValueError("'events' is not an object")
            for event_type, event in events.items():
                if event_type not in EVENT_TYPES:
                    continue
                subject = event.get("subject") if isinstance(event, dict) else None
                if not isinstance(subject, dict):
                    raise ValueError(f"{event_type} has no subject")
                kind = subject.get("format")
                if kind == "iss_sub" and isinstance(subject.get("iss"), str) and isinstance(subject.get("sub"), str):
                    subjects.add((subject["iss"], subject["sub"]))
                elif kind == "opaque" and isinstance(set_issuer, str) and isinstance(subject.get("id"), str):
                    subjects.add((set_issuer, subject["id"]))
                elif kind == "jwt_id" and isinstance(subject.get("iss"), str) and isinstance(subject.get("jti"), str):
                    token_ids.add((subject["iss"], subject["jti"]))
                else:
                    raise ValueError(f"subject format {kind!r} is not iss_sub, opaque or jwt_id (or lacks its fields)")
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeError) as exc:
            logger.warning("%s, line %d: not a revocation event, skipped (%s)", source, number, exc)
    return Revocations(frozenset(subjects), frozenset(token_ids))


def _issuers(issuers: Iterable[str], kind: str) -> frozenset[str]:
    if isinstance(issuers, str):
        issuers = [issuers]
    found = frozenset(issuers or ())
    if not found or not all(isinstance(i, str) and i.strip() for i in found):
        raise InvalidArgument(f"{kind}(issuers=...) names the token issuers the feed speaks for, e.g. "
                              f"['https://idp.example.com']")
    return found


def _staleness(value: Any, kind: str, *, required: bool) -> dt.timedelta | None:
    if value is None and not required:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = dt.timedelta(seconds=value)
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise InvalidArgument(f"{kind}(max_staleness=...) must be a positive timedelta or number of seconds")
    return value


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class _Feed:
    """What both feeds share: the answer from a set of revocations, its freshness and issuers."""

    kind = "RevocationFeed"

    def __init__(self, issuers: Iterable[str], max_staleness: dt.timedelta | None,
                 clock: Callable[[], dt.datetime] | None) -> None:
        self.issuers = _issuers(issuers, self.kind)
        self.max_staleness = max_staleness
        self.clock = clock or _utc_now
        self._read_at: dt.datetime | None = None
        self._revocations = Revocations()
        self._lock = threading.Lock()

    @property
    def read_at(self) -> dt.datetime | None:
        return self._read_at

    def _update(self) -> None:  # overridden: bring the contents up to date if it is time
        raise NotImplementedError

    def revoked(self, *, issuer: str, subject: str | None, token_id: str | None) -> bool:
        if issuer not in self.issuers:
            return False
        with self._lock:
            self._update()
            read_at, contents = self._read_at, self._revocations
        if read_at is None or (self.max_staleness is not None and self.clock() - read_at > self.max_staleness):
            logger.warning("%s for %s is stale (read at %s, max staleness %s): every principal of that issuer is "
                           "refused", self.kind, issuer, read_at, self.max_staleness)
            return True
        return ((subject is not None and (issuer, subject) in contents.subjects)
                or (token_id is not None and (issuer, token_id) in contents.token_ids))


class FileRevocationFeed(_Feed):
    """SETs one per line in a local file, read again when it changes."""

    kind = "FileRevocationFeed"

    def __init__(self, path: str | Path, *, issuers: Iterable[str], max_staleness: dt.timedelta | float | None = None,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        super().__init__(issuers, _staleness(max_staleness, self.kind, required=False), clock)
        self.path = Path(path)
        self._seen: tuple[int, int] | None = None
        with self._lock:
            self._update()
        if self._read_at is None:
            raise InvalidArgument(f"FileRevocationFeed: {self.path} cannot be read; create it (an empty file revokes "
                                  f"nothing) or fix the path")

    def _update(self) -> None:
        try:
            stat = self.path.stat()
            if self._seen == (stat.st_mtime_ns, stat.st_size):
                return
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            logger.warning("FileRevocationFeed: %s cannot be read (%s); the feed is treated as stale", self.path, exc)
            self._read_at, self._seen = None, None
            return
        self._revocations = parse_sets(text, str(self.path))
        self._seen = (stat.st_mtime_ns, stat.st_size)
        self._read_at = dt.datetime.fromtimestamp(stat.st_mtime, dt.timezone.utc)


class PollingRevocationFeed(_Feed):
    """SETs one per line served at ``url``, fetched at most every ``poll_interval``."""

    kind = "PollingRevocationFeed"

    def __init__(self, url: str, *, issuers: Iterable[str], max_staleness: dt.timedelta | float,
                 poll_interval: dt.timedelta | float = 60, http_timeout: float = 5,
                 max_body_bytes: int = 1024 * 1024, clock: Callable[[], dt.datetime] | None = None) -> None:
        super().__init__(issuers, _staleness(max_staleness, self.kind, required=True), clock)
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise InvalidArgument(f"PollingRevocationFeed(url=...) is an https:// URL, not {url!r}")
        self.url = url
        self.poll_interval = _staleness(poll_interval, self.kind, required=True)
        if not isinstance(max_body_bytes, int) or max_body_bytes <= 0:
            raise InvalidArgument("PollingRevocationFeed(max_body_bytes=...) must be a positive number of bytes")
        self.http_timeout, self.max_body_bytes = float(http_timeout), max_body_bytes
        self._attempted_at: dt.datetime | None = None
        self.fetches = 0

    def _update(self) -> None:
        now = self.clock()
        if self._attempted_at is not None and now - self._attempted_at < self.poll_interval:
            return
        self._attempted_at, self.fetches = now, self.fetches + 1
        try:
            with urllib.request.urlopen(self.url, timeout=self.http_timeout) as answer:  # noqa: S310 - configured
                body = answer.read(self.max_body_bytes + 1)
            if len(body) > self.max_body_bytes:
                raise ValueError(f"the body is over {self.max_body_bytes} bytes")
            text = body.decode("utf-8")
        except Exception as exc:  # noqa: BLE001 - the last good contents stay, ageing towards stale
            logger.warning("PollingRevocationFeed: %s could not be fetched (%s)", self.url, exc)
            return
        self._revocations, self._read_at = parse_sets(text, self.url), now
