"""What the gateway records of where a call came from: bounded, valid UTF-8 text; the clientInfo
of the request, else of the session's initialize, else none; a bounded memory of sessions."""
from __future__ import annotations

from ctrlrun.gateway.origin import CLIENT_INFO_META, MAX_TEXT, Sessions, bounded, client_info, origin


def test_text_is_bounded_and_made_valid_utf8():
    assert bounded("x" * (MAX_TEXT + 50)) == "x" * MAX_TEXT + "…"
    assert bounded("a\ud800b") == "a?b"  # a lone surrogate could not be stored as UTF-8
    assert bounded("a\u202eb") == "a\u202eb"  # kept as sent: the console escapes it
    assert [bounded(v) for v in (None, "", 7, ["x"])] == [None, None, None, None]
    assert client_info({"name": "ide", "version": 3}) == {"name": "ide", "version": None}
    assert client_info({"version": "1"}) is None and client_info("ide") is None


def test_the_request_clientinfo_else_the_sessions_else_none():
    sessions = Sessions()
    sessions.remember("s1", client_info({"name": "from-initialize", "version": "1"}))
    common = {"alias": "pay", "upstream": "http://127.0.0.1:1/mcp", "user_agent": "ua/1", "sessions": sessions}
    own = origin(meta={CLIENT_INFO_META: {"name": "from-request", "version": "2"}}, session_id="s1", **common)
    assert own["client"] == {"name": "from-request", "version": "2"}
    assert origin(meta={}, session_id="s1", **common)["client"] == {"name": "from-initialize", "version": "1"}
    unknown = origin(meta=None, session_id="s2", **common)
    assert unknown == {"surface": "mcp-gateway", "client": None, "user_agent": "ua/1", "session_id": "s2",
                       "upstream": {"alias": "pay", "url": "http://127.0.0.1:1/mcp"}}
    sessions.forget("s1")
    assert origin(meta={}, session_id="s1", **common)["client"] is None


def test_the_sessions_remembered_are_bounded_oldest_first():
    sessions = Sessions(limit=3)
    for n in range(5):
        sessions.remember(f"s{n}", {"name": f"c{n}", "version": None})
    assert [sessions.client(f"s{n}") is not None for n in range(5)] == [False, False, True, True, True]


def test_the_upstream_url_is_recorded_without_credentials_or_a_query():
    """The origin joins the event chain for good: a password or a token in the URL must never be in it."""
    recorded = origin(alias="pay", upstream="https://user:s3cret@tools.example:8443/mcp?token=abc", meta=None,
                      session_id=None, user_agent=None, sessions=Sessions())["upstream"]["url"]
    assert recorded == "https://tools.example:8443/mcp", recorded
