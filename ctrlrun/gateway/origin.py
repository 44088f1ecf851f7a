"""Where a gateway call came from, as its evidence records it (``kernel.context.call_origin``).

For each ``tools/call`` the gateway records, in the call's ACTION_PROPOSED event (hash-chained with
the rest of the call's events), a JSON object::

    {"surface": "mcp-gateway",
     "client": {"name": ..., "version": ...} | null,   # MCP clientInfo, as the client names itself
     "user_agent": ... | null,                         # the request's User-Agent header
     "session_id": ... | null,                         # the Mcp-Session-Id header
     "upstream": {"alias": ..., "url": ...}}

``client`` is the request's own ``_meta`` clientInfo (the 2026-07-28 revision sends it with every
request), else the clientInfo of the ``initialize`` this gateway relayed for the session (legacy
revisions), else null: the console then names the User-Agent. Both are what the client says of
itself, not an identity. Every string is bounded (``MAX_TEXT``, ``MAX_URL``) and made valid UTF-8;
the console shows them escaped (``ctrlrun.display``).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any
from ctrlrun.gateway.wire import shown_url

__all__ = ["CLIENT_INFO_META", "MAX_TEXT", "MAX_URL", "Sessions", "bounded", "client_info", "origin"]

#: The ``_meta`` key under which the current revision's client sends its clientInfo on each request.
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"
#: The longest name, version, User-Agent or session id kept (characters; a longer one is cut, with "…").
MAX_TEXT = 256
MAX_URL = 2048
#: The most sessions whose initialize clientInfo is remembered (the oldest is forgotten first).
MAX_SESSIONS = 4096


def bounded(value: Any, limit: int = MAX_TEXT) -> str | None:
    """``value`` as recordable text: a str (else None), lone surrogates replaced, at most ``limit``
    characters (cut ones end with "…")."""
    if not isinstance(value, str) or not value:
        return None
    text = value.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "…"


def client_info(value: Any) -> dict[str, str | None] | None:
    """An MCP ``clientInfo`` (``{"name", "version", ...}``) as recorded: its name and version, bounded."""
    if not isinstance(value, dict):
        return None
    name = bounded(value.get("name"))
    if name is None:
        return None
    return {"name": name, "version": bounded(value.get("version"))}


class Sessions:
    """The clientInfo of each session whose ``initialize`` this gateway relayed, by the
    ``Mcp-Session-Id`` the upstream gave it (bounded; a process of its own: another worker's
    sessions are not known here, and their calls name the User-Agent)."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self._limit = limit
        self._seen: OrderedDict[str, dict[str, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, session_id: str | None, info: dict[str, str | None] | None) -> None:
        key = bounded(session_id)
        if key is None or info is None:
            return
        with self._lock:
            self._seen[key] = info
            self._seen.move_to_end(key)
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)

    def forget(self, session_id: str | None) -> None:
        key = bounded(session_id)
        if key is not None:
            with self._lock:
                self._seen.pop(key, None)

    def client(self, session_id: str | None) -> dict[str, str | None] | None:
        key = bounded(session_id)
        if key is None:
            return None
        with self._lock:
            return self._seen.get(key)


def origin(*, alias: str, upstream: str, meta: Any, session_id: str | None, user_agent: str | None,
           sessions: Sessions) -> dict[str, Any]:
    """The origin of one ``tools/call`` (see the module's docstring)."""
    client = client_info(meta.get(CLIENT_INFO_META)) if isinstance(meta, dict) else None
    if client is None:
        client = sessions.client(session_id)
    return {"surface": "mcp-gateway", "client": client, "user_agent": bounded(user_agent),
            "session_id": bounded(session_id),
            "upstream": {"alias": alias, "url": bounded(shown_url(upstream), MAX_URL)}}
