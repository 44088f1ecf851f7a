"""``JWTIdentityProvider``: construction checks, the attacks (alg none, key confusion, wrong
audience, expiry inside and beyond the leeway, huge or malformed tokens), JWKS from a real
loopback server with rate-limited refresh, and a verified principal reaching the receipt.
"""
from __future__ import annotations

import builtins
import datetime as dt
import json
import logging

import jwt as pyjwt
import pytest

import ctrlrun
from ctrlrun import IdentityContext, IdentityError, Principal
from ctrlrun.jwt_identity import JWTIdentityProvider
from ctrlrun.testing import Clock
from tests.support import AUDIENCE, ISSUER, Served, jwk_of, public_pem, receipts, rsa_key, serve, sign

SECRET = "s" * 40
NOW = Clock().now


@pytest.fixture(scope="module")
def key():
    return rsa_key()


def _claims(**changes):
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "agent-7", "act_for": "dana", "tenant": "t1",
              "exp": int((NOW + dt.timedelta(minutes=10)).timestamp()), "iat": int(NOW.timestamp())}
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _ask(token: str | None, header: str = "authorization", scheme: str = "Bearer ") -> IdentityContext:
    headers = {} if token is None else {header: f"{scheme}{token}"}
    return IdentityContext(action="tickets.close", environment="production", headers=headers)


def _hs(**options):
    base = dict(secret=SECRET, algorithms=["HS256"], issuer=ISSUER, audience=AUDIENCE, token_type="at+jwt",
                user_claim="act_for", claim_names=("tenant",), clock=lambda: NOW)
    base.update(options)
    return JWTIdentityProvider(**base)


def _rs(key, **options):
    base = dict(public_key=public_pem(key), algorithms=["RS256"], issuer=ISSUER, audience=AUDIENCE,
                token_type="at+jwt", clock=lambda: NOW)
    base.update(options)
    return JWTIdentityProvider(**base)


def _rejected(provider, ask, caplog, detail: str) -> None:
    with caplog.at_level(logging.WARNING, logger="ctrlrun.identity"):
        with pytest.raises(IdentityError) as refused:
            provider.resolve(ask)
    assert str(refused.value) == "credential rejected" and refused.value.__cause__ is None
    assert any(detail in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_the_observed_hs256_token_names_agent_user_and_allowed_claims():
    provider = _hs()
    token = sign(_claims(), SECRET, alg="HS256")
    assert provider.resolve(_ask(token)) == Principal(
        "agent-7", "dana", claims={"tenant": "t1"}, issuer=ISSUER,
        expires_at=dt.datetime.fromtimestamp(_claims()["exp"], dt.timezone.utc))
    assert provider.resolve(_ask(None)) is None  # no header: a decline
    assert provider.resolve(_ask("  ", scheme="")) is None


def test_construction_checks():
    with pytest.raises(ctrlrun.InvalidArgument, match="'none'"):
        _hs(algorithms=["none"])
    with pytest.raises(ctrlrun.InvalidArgument, match="'none'"):
        _hs(algorithms=["HS256", "NONE"])
    with pytest.raises(ctrlrun.InvalidArgument, match="secret is for HS256"):
        _hs(algorithms=["RS256"])
    with pytest.raises(ctrlrun.InvalidArgument, match="exactly one"):
        _hs(public_key="x")
    with pytest.raises(ctrlrun.InvalidArgument, match="no default"):
        _hs(algorithms=[])
    with pytest.raises(ctrlrun.InvalidArgument, match="issuer"):
        _hs(issuer="")
    with pytest.raises(ctrlrun.InvalidArgument, match="audience"):
        _hs(audience=[])
    with pytest.raises(TypeError, match="token_type"):
        JWTIdentityProvider(secret=SECRET, algorithms=["HS256"], issuer=ISSUER, audience=AUDIENCE)
    with pytest.raises(ctrlrun.InvalidArgument, match="at least 32"):
        _hs(secret="short")
    with pytest.raises(ctrlrun.InvalidArgument, match="public key"):
        _rs(rsa_key(), public_key="-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")


def test_token_type_none_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="ctrlrun.identity"):
        provider = _hs(token_type=None)
    assert any("any 'typ'" in r.getMessage() for r in caplog.records)
    assert provider.resolve(_ask(sign(_claims(), SECRET, alg="HS256", typ=None))).agent == "agent-7"


def test_a_missing_pyjwt_names_the_pip_line(monkeypatch):
    real = builtins.__import__

    def without_jwt(name, *args, **kwargs):
        if name == "jwt" or name.startswith("jwt."):
            raise ImportError("No module named 'jwt'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_jwt)
    with pytest.raises(ctrlrun.MissingDependency) as missing:
        _hs()
    assert (missing.value.module, missing.value.extra) == ("jwt", "identity")
    assert "pip install 'PyJWT[crypto]>=2.8' (django-ctrlrun's identity extra)" in str(missing.value)
    from tests.support import REPO
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["identity"] == ["PyJWT[crypto]>=2.8"] and "PyJWT[crypto]>=2.8" in extras["test"]


def test_alg_none_is_refused(caplog):
    unsigned = pyjwt.encode(_claims(), None, algorithm="none", headers={"typ": "at+jwt"})
    _rejected(_hs(), _ask(unsigned), caplog, "alg 'none'")


def test_hs256_signed_with_the_rsa_public_key_is_refused(key, caplog):
    """Key confusion: the attacker signs HS256 with the server's public key as the HMAC secret."""
    import hashlib
    import hmac

    head = pyjwt.utils.base64url_encode(json.dumps({"alg": "HS256", "typ": "at+jwt"}).encode())
    body = pyjwt.utils.base64url_encode(json.dumps(_claims()).encode())
    mac = hmac.new(public_pem(key).encode(), head + b"." + body, hashlib.sha256).digest()
    forged = (head + b"." + body + b"." + pyjwt.utils.base64url_encode(mac)).decode()
    _rejected(_rs(key), _ask(forged), caplog, "alg 'HS256'")
    with pytest.raises(ctrlrun.InvalidArgument, match="needs secret"):
        _rs(key, algorithms=["RS256", "HS256"])


def test_wrong_audience_issuer_signature_and_typ(key, caplog):
    provider = _rs(key)
    _rejected(provider, _ask(sign(_claims(aud="another-api"), key)), caplog, "InvalidAudience")
    _rejected(provider, _ask(sign(_claims(iss="https://evil.test"), key)), caplog, "InvalidIssuer")
    _rejected(provider, _ask(sign(_claims(), rsa_key())), caplog, "InvalidSignature")
    _rejected(provider, _ask(sign(_claims(), key, typ="JWT")), caplog, "typ 'JWT'")
    _rejected(provider, _ask(sign(_claims(), key, typ=None)), caplog, "typ None")
    _rejected(provider, _ask(sign(_claims(exp=None), key)), caplog, "exp")
    assert provider.resolve(_ask(sign(_claims(), key, typ="application/at+jwt"))).agent == "agent-7"
    assert provider.resolve(_ask(sign(_claims(aud=["x", AUDIENCE]), key))).agent == "agent-7"


def test_expiry_inside_and_beyond_the_leeway(key, caplog):
    provider = _rs(key, leeway=60)
    inside = sign(_claims(exp=int(NOW.timestamp()) - 30), key)
    assert provider.resolve(_ask(inside)).agent == "agent-7"
    beyond = sign(_claims(exp=int(NOW.timestamp()) - 61), key)
    _rejected(provider, _ask(beyond), caplog, "expired")
    _rejected(provider, _ask(sign(_claims(nbf=int(NOW.timestamp()) + 120), key)), caplog, "not valid before")
    _rejected(_rs(key, leeway=0), _ask(inside), caplog, "expired")


@pytest.mark.parametrize("header", [
    "Bearer " + "a" * 9000,
    "Bearer not.a.jwt",
    "Bearer \u202eeyJ.eyJ.sig",
    "Bearer abc\x00def",
    "Basic dXNlcjpwYXNz",
    "Bearer ",
    "eyJhbGciOiJIUzI1NiJ9",
])
def test_huge_malformed_or_hostile_headers_are_refused_coarsely(header, caplog):
    ask = IdentityContext(action="a", environment="production", headers={"Authorization": header})
    if not header.strip():
        assert _hs().resolve(ask) is None
        return
    with pytest.raises(IdentityError, match="^credential rejected$"):
        _hs().resolve(ask)


@pytest.mark.parametrize("changes", [{"exp": 2**41}, {"exp": -1}, {"exp": "tomorrow"}, {"exp": True},
                                     {"nbf": 1e300}, {"sub": 7}, {"act_for": ["dana"]}, {"tenant": 1.5}])
def test_hostile_claims_are_refused_coarsely(changes, caplog):
    token = sign(_claims(**changes), SECRET, alg="HS256")
    with pytest.raises(IdentityError, match="^credential rejected$"):
        _hs().resolve(_ask(token))


@pytest.mark.parametrize("kid", [{"a": 1}, ["k1"], 7, "k" * 300])
def test_a_hostile_kid_is_refused_coarsely(key, kid):
    served = Served(json.dumps({"keys": [jwk_of(key, "k1", use="sig")]}).encode())
    head = pyjwt.utils.base64url_encode(json.dumps({"alg": "RS256", "typ": "at+jwt", "kid": kid}).encode())
    token = sign(_claims(), key, kid="k1")
    forged = head.decode() + token[token.index("."):]
    with serve(served):
        provider = JWTIdentityProvider(jwks_url=served.url, algorithms=["RS256"], issuer=ISSUER, audience=AUDIENCE,
                                       token_type="at+jwt", clock=lambda: NOW)
        with pytest.raises(IdentityError, match="^credential rejected$"):
            provider.resolve(_ask(forged))


def test_a_jwks_server_on_loopback_with_rate_limited_refresh(key, caplog):
    other = rsa_key()
    served = Served(json.dumps({"keys": [
        jwk_of(key, "k1", use="sig", alg="RS256"),
        jwk_of(other, "enc-key", use="enc"),
        jwk_of(other, "no-verify", key_ops=["encrypt"]),
        {"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},
    ]}).encode())
    clock = Clock(NOW)
    with serve(served):
        provider = JWTIdentityProvider(jwks_url=served.url, algorithms=["RS256"], issuer=ISSUER, audience=AUDIENCE,
                                       token_type="at+jwt", jwks_min_refresh_interval=30, clock=clock)
        assert provider.resolve(_ask(sign(_claims(), key, kid="k1"))).agent == "agent-7"
        assert served.hits == 1
        for kid in ("enc-key", "no-verify", "sym"):  # held by the server, skipped by the provider
            _rejected(provider, _ask(sign(_claims(), other, kid=kid)), caplog, "no signing key")
        assert served.hits == 1  # unknown kids within the interval fetch nothing more
        rotated = rsa_key()
        served.body = json.dumps({"keys": [jwk_of(rotated, "k2", use="sig")]}).encode()
        _rejected(provider, _ask(sign(_claims(), rotated, kid="k2")), caplog, "no signing key")
        clock.advance(seconds=30)
        assert provider.resolve(_ask(sign(_claims(exp=int(clock.now.timestamp()) + 60), rotated, kid="k2"))).agent
        assert served.hits == 2


def test_a_verified_token_reaches_the_receipt_and_a_bad_one_leaves_none(store_db, key, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("schema: ctrlrun.policy/v2\nactions:\n  tickets.close:\n    decision: allow\n")
    clock = Clock(NOW)
    control = ctrlrun.Control.from_file(path, identity=_rs(key, claim_names=("tenant",), user_claim="act_for",
                                                           clock=clock), clock=clock)
    token = sign(_claims(), key)
    control.call("tickets.close", {"ticket": "j1"}, lambda: "ok", headers={"Authorization": f"Bearer {token}"})
    principal = receipts()[-1]["principal"]
    assert principal == {"agent": "agent-7", "user": "dana", "claims": {"tenant": "t1"}, "issuer": ISSUER,
                         "expires_at": dt.datetime.fromtimestamp(_claims()["exp"], dt.timezone.utc)
                         .strftime("%Y-%m-%dT%H:%M:%S.000Z")}
    forged = sign(_claims(), rsa_key())
    with pytest.raises(IdentityError, match="^credential rejected$"):
        control.call("tickets.close", {"ticket": "j2"}, lambda: "ok", headers={"Authorization": f"Bearer {forged}"})
    assert len(receipts()) == 1
    # the verified token's expiry is the principal's: past it (within the leeway), a denied receipt
    clock.advance(minutes=10, seconds=30)
    with pytest.raises(IdentityError, match="principal_expired"):
        control.call("tickets.close", {"ticket": "j3"}, lambda: "ok", headers={"Authorization": f"Bearer {token}"})
    assert receipts()[-1]["decision_reason"] == "principal_expired"
