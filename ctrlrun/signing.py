"""Signatures only ctrlrun's own processes can make: MACs over the rows a forger would want.

Hash chains show that evidence changed, but anyone can compute a SHA-256: someone who may only
INSERT and UPDATE rows (an application's database role, a leaked ``DATABASE_URL``) could append a
well-formed receipt and move the chain head, or set an approval ``granted``. A MAC needs a key
that is kept *outside* the database, so such a row cannot be made to verify. The store signs

- the chain head (receipts' and events' seq and hash), so a forged head is named by verify;
- every approval row it writes (the request, the human's answer, its consumption), checked before
  an approval is answered or used;
- every effect record it writes (state, holder, attempt, lease, resolver), checked before a
  ``failed`` record is retried, a lapsed lease is swept, or an ambiguous record is resolved.

The key, in order: ``settings.CTRLRUN_SIGNING_KEY`` or ``$CTRLRUN_SIGNING_KEY``; the key file
named by ``settings.CTRLRUN_SIGNING_KEY_FILE`` or ``$CTRLRUN_SIGNING_KEY_FILE``; inside a Django
project, a key derived from ``SECRET_KEY``; otherwise the key file ``signing.key`` beside a SQLite
store, or in ``.ctrlrun/`` beside the policy for PostgreSQL, created on first use with mode 0600. Every process writing to
one store must use the same key: the store records the key's id on its chain head and a process
with another key is refused before it acts.

What the key file protects against, for a plain script's SQLite store: edits by tools and people
that do not have the file (a copied or restored database, a SQL console on another machine). It
does not protect against the operating-system user who can read both files.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import InvalidArgument

__all__ = ["key_id", "sign", "is_valid", "key_source", "reset", "MAC_PREFIX"]

MAC_PREFIX = "hmac-sha256:"
#: A key shorter than this is almost certainly a placeholder ("changeme"), not a secret.
MIN_KEY_LENGTH = 16
KEY_FILE_NAME = "signing.key"

_lock = threading.Lock()
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_cached: tuple[bytes, str, str] | None = None  # (key, key id, where it came from)


def _setting(name: str) -> Any:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    if not settings.configured:
        return None
    try:
        return getattr(settings, name, None)
    except ImproperlyConfigured:  # Django refuses to hand out an empty SECRET_KEY: there is none
        return None


def _explicit_key() -> tuple[bytes, str] | None:
    for value, where in ((_setting("CTRLRUN_SIGNING_KEY"), "settings.CTRLRUN_SIGNING_KEY"),
                         (os.environ.get("CTRLRUN_SIGNING_KEY"), "$CTRLRUN_SIGNING_KEY")):
        if value is None or value == "":
            continue
        text = str(value).strip()
        if len(text) < MIN_KEY_LENGTH:
            raise InvalidArgument(
                f"{where} is {len(text)} characters; a signing key needs at least {MIN_KEY_LENGTH} (e.g. "
                f"python3 -c 'import secrets; print(secrets.token_hex(32))')"
            )
        return text.encode("utf-8"), where
    return None


def _derived_key() -> tuple[bytes, str] | None:
    """Inside a Django project (not a plain script), a key derived from SECRET_KEY."""
    if _setting("CTRLRUN_STANDALONE"):
        return None
    secret = _setting("SECRET_KEY")
    if not secret:
        return None
    derived = hmac.new(str(secret).encode("utf-8"), b"ctrlrun.signing-key/v1", hashlib.sha256).digest()
    return derived, "derived from settings.SECRET_KEY"


def _named_key_file() -> str | None:
    return _setting("CTRLRUN_SIGNING_KEY_FILE") or os.environ.get("CTRLRUN_SIGNING_KEY_FILE") or None


def key_file_path() -> Path:
    """Where the key file is read from (and created, if missing)."""
    configured = _named_key_file()
    if configured:
        return Path(str(configured)).expanduser().absolute()
    from django.db import connections

    from . import conf

    settings_dict = connections[conf.database_alias()].settings_dict
    if settings_dict.get("ENGINE", "").endswith("sqlite3") and settings_dict.get("NAME"):
        return Path(str(settings_dict["NAME"])).absolute().parent / KEY_FILE_NAME
    return conf.policy_path().absolute().parent / ".ctrlrun" / KEY_FILE_NAME


def _file_key() -> tuple[bytes, str]:
    path = key_file_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it a moment ago: read theirs
        else:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_hex(32) + "\n")
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise InvalidArgument(f"the signing key file {path} could not be read ({exc}); set CTRLRUN_SIGNING_KEY "
                              f"or CTRLRUN_SIGNING_KEY_FILE") from None
    if len(text) < MIN_KEY_LENGTH:
        raise InvalidArgument(f"the signing key file {path} holds no usable key; delete it only if this store has "
                              f"never been signed, or restore it from a backup")
    return text.encode("utf-8"), f"key file {path}"


def _resolve() -> tuple[bytes, str, str]:
    global _cached
    if _cached is None:
        with _lock:
            if _cached is None:
                # A key file someone named is as explicit as a key: it wins over the derived one.
                key, where = _explicit_key() or (_file_key() if _named_key_file() else None) or _derived_key() \
                    or _file_key()
                identity = hmac.new(key, b"ctrlrun.key-id/v1", hashlib.sha256).hexdigest()[:16]
                _cached = (key, identity, where)
    return _cached


def key_id() -> str:
    """A short public name of this process's key (never the key): the store records it."""
    return _resolve()[1]


def key_source() -> str:
    """Where the key came from, for messages (never the key itself)."""
    return _resolve()[2]


def sign(domain: str, fields: Sequence[Any]) -> str:
    """The MAC of ``fields`` (strings, ints and None, in a fixed order) under ``domain``
    (e.g. ``ctrlrun.approval/v1``): HMAC-SHA256 over their compact JSON array, which is
    unambiguous and, unlike sorted canonical JSON, cheap enough for every write of the hot path."""
    payload = _COMPACT.encode([domain, *fields]).encode("utf-8")
    return MAC_PREFIX + hmac.new(_resolve()[0], payload, hashlib.sha256).hexdigest()


def is_valid(domain: str, fields: Sequence[Any], mac: str | None) -> bool:
    """Whether ``mac`` is this key's signature of ``fields`` (constant-time)."""
    if not isinstance(mac, str) or not mac.startswith(MAC_PREFIX):
        return False
    try:
        expected = sign(domain, fields)
    except (TypeError, ValueError):  # a tampered row may hold values that cannot be encoded
        return False
    return hmac.compare_digest(expected, mac)


def reset() -> None:
    """Forget the cached key (tests, or changed settings)."""
    global _cached
    with _lock:
        _cached = None
