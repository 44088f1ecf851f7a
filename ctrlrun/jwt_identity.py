"""``JWTIdentityProvider``: the principal from a verified JWT access token (the ``identity`` extra).

Built over PyJWT (``PyJWT[crypto]`` for the asymmetric algorithms). What it checks, in order:

1. construction: exactly one key source (``jwks_url``, ``public_key`` or ``secret``); an explicit
   algorithm list without ``none``; no ``secret`` for an asymmetric algorithm and no public key
   or JWKS for an HMAC one (the key-confusion attack); ``issuer`` (exact), ``audience``
   (membership) and ``token_type`` are required (``token_type=None`` accepts any ``typ``, with a
   warning);
2. per call: no header (or a blank one) declines; otherwise a ``Bearer`` token of sane size, whose
   ``alg`` is in the list and whose ``typ`` matches (an ``application/`` prefix ignored), signed
   by the key, with ``iss`` and ``exp`` present, the time window (``exp``, ``nbf``, ``iat``) checked
   against ``clock`` with ``leeway``, the audience by membership, and the revocation feed (D3)
   consulted when given.

Every failure is the same ``IdentityError("credential rejected")``: what was wrong is written to
the ``ctrlrun.identity`` log and never told to whoever presented the token.

JWKS keys are fetched on first use and again when a token names a ``kid`` not held, at most once
per ``jwks_min_refresh_interval``; a key whose ``use`` is not ``sig``, whose ``key_ops`` lacks
``verify``, whose ``alg`` is not allowed, or that is symmetric (``kty: oct``) is skipped.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from .canonical import Principal
from .errors import IdentityError, InvalidArgument, MissingDependency
from .identity import IdentityContext, clean_header

__all__ = ["JWTIdentityProvider"]

logger = logging.getLogger("ctrlrun.identity")

REJECTED = "credential rejected"
#: What the ``identity`` extra installs (pyproject.toml), named by a missing dependency's message.
REQUIREMENT = "PyJWT[crypto]>=2.8"
#: A token longer than this is refused before it is parsed.
MAX_TOKEN_LENGTH = 8192
MAX_JWKS_BYTES = 1024 * 1024
_HMAC = frozenset({"HS256", "HS384", "HS512"})
_YEAR_10000 = 253402300800  # seconds since the epoch: a time past it is no time a datetime holds


def _jwt() -> Any:
    try:
        import jwt
    except ImportError:
        raise MissingDependency("jwt", "identity", REQUIREMENT) from None
    return jwt


def _seconds(value: Any, what: str, *, zero: bool = False) -> dt.timedelta:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = dt.timedelta(seconds=value)
    if not isinstance(value, dt.timedelta) or value < dt.timedelta(0) or (not zero and not value):
        raise InvalidArgument(f"JWTIdentityProvider({what}=...) must be a {'non-negative' if zero else 'positive'} "
                              f"timedelta or number of seconds, not {value!r}")
    return value


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class _Rejected(Exception):
    """One reason a token is refused (logged; the caller sees only ``credential rejected``)."""


class JWTIdentityProvider:
    """The principal of a verified bearer JWT (see the module docstring)."""

    def __init__(self, *, jwks_url: str | None = None, public_key: Any = None, secret: str | bytes | None = None,
                 algorithms: Sequence[str], issuer: str, audience: str | Sequence[str], token_type: str | None,
                 header: str = "authorization", agent_claim: str = "sub", user_claim: str | None = None,
                 claim_names: Sequence[str] = (), leeway: dt.timedelta | float = 60,
                 jwks_min_refresh_interval: dt.timedelta | float = 30, http_timeout: float = 5,
                 revocations: Any = None, clock: Callable[[], dt.datetime] | None = None) -> None:
        jwt = _jwt()
        sources = [name for name, value in (("jwks_url", jwks_url), ("public_key", public_key), ("secret", secret))
                   if value is not None]
        if len(sources) != 1:
            raise InvalidArgument(f"JWTIdentityProvider needs exactly one of jwks_url, public_key or secret "
                                  f"(got {', '.join(sources) or 'none'})")
        if isinstance(algorithms, str) or not isinstance(algorithms, Sequence) or not algorithms:
            raise InvalidArgument("JWTIdentityProvider(algorithms=...) is a non-empty list, e.g. ['RS256']; there is "
                                  "no default")
        known = jwt.algorithms.get_default_algorithms()
        for name in algorithms:
            if not isinstance(name, str) or name.lower() == "none":
                raise InvalidArgument("JWTIdentityProvider refuses the 'none' algorithm: an unsigned token proves "
                                      "nothing")
            if name not in known:
                if name not in ("HS256", "HS384", "HS512"):
                    try:
                        import cryptography  # noqa: F401
                    except ImportError:
                        raise MissingDependency("cryptography", "identity", REQUIREMENT) from None
                raise InvalidArgument(f"JWTIdentityProvider(algorithms=...): {name!r} is not an algorithm PyJWT "
                                      f"knows ({', '.join(sorted(known))})")
        symmetric = [name for name in algorithms if name in _HMAC]
        if secret is not None and len(symmetric) != len(algorithms):
            raise InvalidArgument("JWTIdentityProvider: a secret is for HS256/HS384/HS512 only; an asymmetric "
                                  "algorithm verifies with public_key= or jwks_url=")
        if secret is None and symmetric:
            raise InvalidArgument(f"JWTIdentityProvider: {symmetric[0]} needs secret=; verifying an HMAC token with a "
                                  f"public key lets anyone who has that key forge tokens")
        if secret is not None and len(secret) < 32:
            raise InvalidArgument("JWTIdentityProvider(secret=...) must be at least 32 bytes")
        if not isinstance(issuer, str) or not issuer.strip():
            raise InvalidArgument("JWTIdentityProvider(issuer=...) is required: the exact 'iss' your tokens carry")
        audiences = [audience] if isinstance(audience, str) else list(audience or ())
        if not audiences or not all(isinstance(a, str) and a.strip() for a in audiences):
            raise InvalidArgument("JWTIdentityProvider(audience=...) is required: this service's audience name(s)")
        if token_type is None:
            logger.warning("JWTIdentityProvider(token_type=None) accepts a token of any 'typ': an ID token or "
                           "another service's token is then taken as an access token here")
        elif not isinstance(token_type, str) or not token_type.strip():
            raise InvalidArgument("JWTIdentityProvider(token_type=...) names the 'typ' to require, e.g. 'at+jwt' "
                                  "(or None to accept any, with a warning)")
        for what, value in (("header", header), ("agent_claim", agent_claim)):
            if not isinstance(value, str) or not value.strip():
                raise InvalidArgument(f"JWTIdentityProvider({what}=...) must be a non-empty name")
        if user_claim is not None and (not isinstance(user_claim, str) or not user_claim):
            raise InvalidArgument("JWTIdentityProvider(user_claim=...) is a claim name or None")
        if isinstance(claim_names, str) or not all(isinstance(name, str) for name in claim_names):
            raise InvalidArgument("JWTIdentityProvider(claim_names=...) is a list of claim names")
        if revocations is not None and not callable(getattr(revocations, "revoked", None)):
            raise InvalidArgument(f"JWTIdentityProvider(revocations=...): {revocations!r} is not a revocation feed "
                                  f"(it needs revoked(issuer=, subject=, token_id=); see ctrlrun.revocation)")
        if clock is not None and not callable(clock):
            raise InvalidArgument("JWTIdentityProvider(clock=...) is a function returning an aware datetime")
        self._jwt = jwt
        self.algorithms = tuple(algorithms)
        self.issuer = issuer
        self.audience = tuple(audiences)
        self.token_type = _typ(token_type) if token_type else None
        self.header = header.strip().lower()
        self.agent_claim, self.user_claim = agent_claim, user_claim
        self.claim_names = tuple(claim_names)
        self.leeway = _seconds(leeway, "leeway", zero=True)
        self.revocations = revocations
        self.clock = clock or _utc_now
        self._key: Any = secret if secret is not None else public_key
        if isinstance(public_key, (str, bytes)):
            _check_public_key(jwt, public_key, self.algorithms)
        self._jwks = None if jwks_url is None else _JWKS(
            jwks_url, self.algorithms, _seconds(jwks_min_refresh_interval, "jwks_min_refresh_interval"),
            float(_seconds(http_timeout, "http_timeout").total_seconds()), self.clock)

    def __repr__(self) -> str:
        return f"JWTIdentityProvider(issuer={self.issuer!r}, audience={self.audience!r})"

    def resolve(self, context: IdentityContext) -> Principal | None:
        raw = context.headers.get(self.header)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        try:
            return self._principal(raw)
        except _Rejected as reason:
            logger.warning("%s: a bearer token was rejected: %s", context.action, reason)
            raise IdentityError(REJECTED) from None

    def _principal(self, raw: Any) -> Principal:
        jwt = self._jwt
        value = clean_header(raw)
        if value is None or len(value) > MAX_TOKEN_LENGTH:
            raise _Rejected("the header is malformed, too long, or carries control characters")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _Rejected("the header is not 'Bearer <token>'")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.exceptions.PyJWTError as exc:
            raise _Rejected(f"not a JWT ({exc})") from None
        alg = header.get("alg")
        if alg not in self.algorithms:
            raise _Rejected(f"alg {alg!r} is not one of {list(self.algorithms)}")
        if self.token_type is not None and _typ(header.get("typ")) != self.token_type:
            raise _Rejected(f"typ {header.get('typ')!r} is not {self.token_type!r}")
        kid = header.get("kid")
        if kid is not None and (not isinstance(kid, str) or len(kid) > 256):
            raise _Rejected("the header's kid is not a short string")
        key = self._key if self._jwks is None else self._jwks.key(kid)
        try:
            claims = jwt.decode(token, key, algorithms=[alg], issuer=self.issuer, audience=list(self.audience),
                                options={"require": ["exp", "iss"], "verify_exp": False, "verify_nbf": False,
                                         "verify_iat": False})
        except jwt.exceptions.PyJWTError as exc:
            raise _Rejected(f"{type(exc).__name__}: {exc}") from None
        expires = self._window(claims)
        agent = claims.get(self.agent_claim)
        user = claims.get(self.user_claim) if self.user_claim else None
        if not isinstance(agent, str) or (user is not None and not isinstance(user, str)):
            raise _Rejected(f"claim {self.agent_claim!r} (or {self.user_claim!r}) is not a string")
        if self.revocations is not None:
            self._not_revoked(claims)
        kept = {name: claims[name] for name in self.claim_names if name in claims}
        try:
            return Principal(agent, user, claims=kept, issuer=claims["iss"], expires_at=expires)
        except InvalidArgument as exc:
            raise _Rejected(f"the claims cannot name a principal: {exc}") from None

    def _window(self, claims: dict[str, Any]) -> dt.datetime:
        now, leeway = self.clock(), self.leeway
        times = {}
        for name in ("exp", "nbf", "iat"):
            value = claims.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < _YEAR_10000:
                raise _Rejected(f"claim {name!r} is not a number of seconds")
            times[name] = dt.datetime.fromtimestamp(value, dt.timezone.utc)
        if now > times["exp"] + leeway:
            raise _Rejected(f"expired at {times['exp'].isoformat()} (leeway {leeway})")
        if "nbf" in times and now < times["nbf"] - leeway:
            raise _Rejected(f"not valid before {times['nbf'].isoformat()}")
        if "iat" in times and now < times["iat"] - leeway:
            raise _Rejected(f"issued in the future ({times['iat'].isoformat()})")
        return times["exp"]

    def _not_revoked(self, claims: dict[str, Any]) -> None:
        subject, token_id = claims.get("sub"), claims.get("jti")
        try:
            revoked = self.revocations.revoked(issuer=claims["iss"],
                                               subject=subject if isinstance(subject, str) else None,
                                               token_id=token_id if isinstance(token_id, str) else None)
        except Exception as exc:  # noqa: BLE001 - a feed that cannot answer refuses
            raise _Rejected(f"the revocation feed failed ({type(exc).__name__}: {exc})") from None
        if revoked:
            raise _Rejected(f"revoked (or the feed is stale): iss={claims['iss']!r} sub={subject!r} jti={token_id!r}")


def _check_public_key(jwt: Any, key: str | bytes, algorithms: Sequence[str]) -> None:
    """A PEM public key is parsed now, so a bad one fails at construction, not at the first call."""
    problems = []
    for name in algorithms:
        try:
            jwt.algorithms.get_default_algorithms()[name].prepare_key(key)
            return
        except Exception as exc:  # noqa: BLE001 - whatever PyJWT/cryptography say of a bad key
            problems.append(f"{name}: {exc}")
    raise InvalidArgument(f"JWTIdentityProvider(public_key=...) is not a usable public key ({'; '.join(problems)})")


def _typ(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    return value[len("application/"):] if value.startswith("application/") else value


class _JWKS:
    """A JWKS endpoint's signing keys, refreshed on an unknown ``kid`` at most once per interval."""

    def __init__(self, url: str, algorithms: Sequence[str], interval: dt.timedelta, timeout: float,
                 clock: Callable[[], dt.datetime]) -> None:
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise InvalidArgument(f"JWTIdentityProvider(jwks_url=...) is an https:// URL, not {url!r}")
        self.url, self.algorithms, self.interval, self.timeout, self.clock = url, algorithms, interval, timeout, clock
        self.keys: dict[str | None, Any] = {}
        self.fetched_at: dt.datetime | None = None
        self.fetches = 0
        self._lock = threading.Lock()

    def key(self, kid: Any) -> Any:
        with self._lock:
            if kid not in self.keys and (self.fetched_at is None or self.clock() - self.fetched_at >= self.interval):
                self._refresh()
            if kid is None and len(self.keys) == 1:
                return next(iter(self.keys.values()))
            if kid not in self.keys:
                raise _Rejected(f"no signing key {kid!r} in {self.url} (refreshed at most every {self.interval})")
            return self.keys[kid]

    def _refresh(self) -> None:
        from jwt import PyJWK

        self.fetched_at, self.fetches = self.clock(), self.fetches + 1
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as answer:  # noqa: S310 - a configured URL
                body = answer.read(MAX_JWKS_BYTES + 1)
            if len(body) > MAX_JWKS_BYTES:
                raise ValueError("the document is over 1 MiB")
            document = json.loads(body)
            entries = document["keys"]
        except Exception as exc:  # noqa: BLE001 - the keys held stay; the token is refused if none fits
            logger.warning("the JWKS at %s could not be read: %s", self.url, exc)
            return
        keys: dict[str | None, Any] = {}
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, dict) or entry.get("kty") == "oct":
                continue
            if entry.get("use", "sig") != "sig" or ("key_ops" in entry and "verify" not in (entry["key_ops"] or ())):
                continue
            if "alg" in entry and entry["alg"] not in self.algorithms:
                continue
            try:
                keys[entry.get("kid")] = PyJWK(entry).key
            except Exception as exc:  # noqa: BLE001 - one unusable key does not spoil the others
                logger.warning("JWKS key %r at %s skipped: %s", entry.get("kid"), self.url, exc)
        self.keys = keys
