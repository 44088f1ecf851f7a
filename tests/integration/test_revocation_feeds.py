"""Revocation feeds: SETs from a file and from a loopback HTTP server, staleness refusing every
principal of the issuer, and a revoked credential leaving a log line and no receipt.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os

import pytest

import ctrlrun
from ctrlrun import IdentityContext, IdentityError
from ctrlrun.jwt_identity import JWTIdentityProvider
from ctrlrun.revocation import FileRevocationFeed, PollingRevocationFeed, RevocationFeed
from ctrlrun.testing import Clock
from tests.support import AUDIENCE, ISSUER, Served, receipts, serve, set_line, sign

SECRET = "r" * 40


def _token(clock, **changes):
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "agent-7", "jti": "tok-1",
              "exp": int((clock.now + dt.timedelta(minutes=10)).timestamp())}
    claims.update(changes)
    return sign(claims, SECRET, alg="HS256")


def _provider(feed, clock):
    return JWTIdentityProvider(secret=SECRET, algorithms=["HS256"], issuer=ISSUER, audience=AUDIENCE,
                               token_type="at+jwt", revocations=feed, clock=clock)


def _ask(token):
    return IdentityContext(action="tickets.close", environment="production", headers={"authorization": f"Bearer {token}"})


def _touch(path, clock):
    stamp = clock.now.timestamp()
    os.utime(path, (stamp, stamp))


def test_a_file_feed_revokes_by_subject_and_by_token_id(tmp_path, caplog):
    clock = Clock()
    path = tmp_path / "revoked.sets"
    path.write_text("\n".join([
        set_line({"format": "iss_sub", "iss": ISSUER, "sub": "agent-x"}),
        json.dumps({"iss": ISSUER, "events": {
            "https://schemas.openid.net/secevent/caep/event-type/credential-change": {
                "subject": {"format": "jwt_id", "iss": ISSUER, "jti": "tok-stolen"}}}}),
        set_line({"format": "opaque", "id": "agent-y"}, event="risc/event-type/account-disabled"),
        "garbage that is not a SET",
        set_line({"format": "email", "email": "a@b"}),
    ]) + "\n")
    _touch(path, clock)
    with caplog.at_level(logging.WARNING, logger="ctrlrun.identity"):
        feed = FileRevocationFeed(path, issuers=[ISSUER], clock=clock)
    assert isinstance(feed, RevocationFeed) and feed.read_at == clock.now.replace(microsecond=0)
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 2
    provider = _provider(feed, clock)
    assert provider.resolve(_ask(_token(clock))).agent == "agent-7"
    for token in (_token(clock, sub="agent-x"), _token(clock, jti="tok-stolen"), _token(clock, sub="agent-y")):
        with pytest.raises(IdentityError, match="^credential rejected$"):
            provider.resolve(_ask(token))
    assert feed.revoked(issuer="https://other.test", subject="agent-x", token_id=None) is False
    # the file changes: read again, and the revocation of agent-x is gone
    path.write_text(set_line({"format": "iss_sub", "iss": ISSUER, "sub": "agent-z"}) + "\n")
    _touch(path, clock)
    os.utime(path, (clock.now.timestamp() + 1, clock.now.timestamp() + 1))
    assert provider.resolve(_ask(_token(clock, sub="agent-x"))).agent == "agent-x"


def test_a_stale_file_feed_refuses_every_principal_of_its_issuer(tmp_path, caplog):
    clock = Clock()
    path = tmp_path / "revoked.sets"
    path.write_text("")
    _touch(path, clock)
    feed = FileRevocationFeed(path, issuers=[ISSUER], max_staleness=dt.timedelta(minutes=5), clock=clock)
    provider = _provider(feed, clock)
    assert provider.resolve(_ask(_token(clock))).agent == "agent-7"
    clock.advance(minutes=6)
    with caplog.at_level(logging.WARNING, logger="ctrlrun.identity"):
        with pytest.raises(IdentityError, match="^credential rejected$"):
            provider.resolve(_ask(_token(clock)))
    assert any("stale" in r.getMessage() for r in caplog.records)
    path.unlink()  # a vanished file: stale too
    clock.advance(seconds=1)
    assert feed.revoked(issuer=ISSUER, subject="anyone", token_id=None) is True


def test_a_polling_feed_on_loopback(caplog):
    clock = Clock()
    served = Served((set_line({"format": "iss_sub", "iss": ISSUER, "sub": "agent-x"}) + "\n").encode())
    with serve(served):
        feed = PollingRevocationFeed(served.url, issuers=[ISSUER], max_staleness=300, poll_interval=60, clock=clock)
        provider = _provider(feed, clock)
        assert provider.resolve(_ask(_token(clock))).agent == "agent-7"
        with pytest.raises(IdentityError):
            provider.resolve(_ask(_token(clock, sub="agent-x")))
        assert served.hits == 1  # within poll_interval: no second fetch
        served.body = b""
        clock.advance(seconds=60)
        assert provider.resolve(_ask(_token(clock, sub="agent-x"))).agent == "agent-x"
        assert served.hits == 2
        served.status = 500  # the server fails: the last good contents age until stale
        clock.advance(seconds=200)
        assert provider.resolve(_ask(_token(clock))).agent == "agent-7"
        clock.advance(seconds=200)
        with pytest.raises(IdentityError):
            provider.resolve(_ask(_token(clock)))
        served.status, served.body = 200, b"x" * 2048
        small = PollingRevocationFeed(served.url, issuers=[ISSUER], max_staleness=300, max_body_bytes=1024,
                                      clock=clock)
        assert small.revoked(issuer=ISSUER, subject="a", token_id=None) is True  # never read: stale


def test_a_revoked_credential_leaves_a_log_line_and_no_receipt(store_db, tmp_path, caplog):
    clock = Clock()
    path = tmp_path / "revoked.sets"
    path.write_text(set_line({"format": "iss_sub", "iss": ISSUER, "sub": "agent-7"}) + "\n")
    _touch(path, clock)
    policy = tmp_path / "policy.yaml"
    policy.write_text("schema: ctrlrun.policy/v2\nactions:\n  tickets.close:\n    decision: allow\n")
    control = ctrlrun.Control.from_file(policy, identity=_provider(FileRevocationFeed(path, issuers=[ISSUER],
                                                                                      clock=clock), clock))
    with caplog.at_level(logging.WARNING, logger="ctrlrun.identity"):
        with pytest.raises(IdentityError, match="^credential rejected$"):
            control.call("tickets.close", {"ticket": "r1"}, lambda: "ok",
                         headers={"authorization": f"Bearer {_token(clock)}"})
    assert receipts() == []
    assert any("revoked" in r.getMessage() and "agent-7" in r.getMessage() for r in caplog.records)


def test_bad_feed_configuration_is_a_clear_error(tmp_path):
    with pytest.raises(ctrlrun.InvalidArgument, match="cannot be read"):
        FileRevocationFeed(tmp_path / "missing.sets", issuers=[ISSUER])
    with pytest.raises(ctrlrun.InvalidArgument, match="issuers"):
        PollingRevocationFeed("https://x.test/", issuers=[], max_staleness=60)
    with pytest.raises(TypeError):
        PollingRevocationFeed("https://x.test/", issuers=[ISSUER])  # max_staleness is required
    with pytest.raises(ctrlrun.InvalidArgument, match="revocation feed"):
        JWTIdentityProvider(secret=SECRET, algorithms=["HS256"], issuer=ISSUER, audience=AUDIENCE, token_type=None,
                            revocations=object())
