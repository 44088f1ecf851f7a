"""Who acts at the gateway (§E1, §D2): ``--principal``, ``--principal-header``/``--user-header`` and
``--identity-jwt-*``, each through the real ``ctrlrun gateway`` process in front of an SDK-built
upstream, with the SDK's own client (raw HTTP for the tokens no honest client sends)."""
from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys

import pytest

from tests.support import executions, mcp_post, script_environment, start_gateway, start_upstream, tools_call

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.pay.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
SECRET = "a-gateway-test-secret-of-at-least-32-bytes"
ISSUER, AUDIENCE = "https://issuer.test", "ctrlrun-gateway"


@pytest.fixture
def upstream(tmp_path):
    server = start_upstream(tmp_path)
    yield server
    server.stop()


def gateway_with(tmp_path, upstream, *identity: str):
    return start_gateway(tmp_path, upstream.url, POLICY, identity=identity)


def banner(proc) -> list[str]:
    lines = []
    while not lines or not lines[-1].startswith("actions:"):
        lines.append(proc.proc.stdout.readline().rstrip("\n"))
    return lines


def sdk_call(url: str, headers: dict[str, str], arguments: dict):
    """One tools/call through the SDK's client sending ``headers`` on every request."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError

    async def run():
        transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
        async with Client(transport) as client:
            try:
                return await client.call_tool("refund", arguments)
            except MCPError as exc:
                return exc

    return asyncio.run(run())


def agents() -> list[str]:
    from ctrlrun.models import Receipt

    return [r.agent for r in Receipt.objects.order_by("seq")]


def test_a_spoofed_identity_header_is_ignored_when_no_header_is_trusted(tmp_path, upstream, store_db):
    gateway = gateway_with(tmp_path, upstream, "--principal", "agent-1")
    try:
        result = sdk_call(gateway.url, {"x-agent": "mallory", "x-user": "root"}, {"payment_id": "p1", "amount": 5})
    finally:
        gateway.stop()
    assert result.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert agents() == ["agent-1"]


def test_a_trusted_header_names_the_agent_and_the_banner_says_so(tmp_path, upstream, store_db):
    gateway = gateway_with(tmp_path, upstream, "--principal-header", "X-Agent", "--user-header", "X-User")
    try:
        said = "\n".join(banner(gateway))
        named = sdk_call(gateway.url, {"X-Agent": "alice", "X-User": "dana"}, {"payment_id": "p1", "amount": 5})
        status, nobody = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p2", "amount": 5}))
    finally:
        gateway.stop()
    assert "identity HeaderIdentityProvider" in said and "'x-agent'" in said and "'x-user'" in said
    assert "worth exactly what the proxy that sets it is worth" in said
    assert named.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert agents() == ["alice"]
    assert status == 403 and nobody["error"]["code"] == -41007
    assert nobody["error"]["data"]["error"] == "ctrlrun.no_principal"
    assert len(executions(upstream)) == 1


def _token(**overrides):
    import jwt

    now = dt.datetime.now(dt.timezone.utc)
    claims = {"sub": "agent-7", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + dt.timedelta(minutes=5),
              "act_for": "dana"}
    algorithm = overrides.pop("algorithm", "HS256")
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    key = None if algorithm == "none" else SECRET
    return jwt.encode(claims, key, algorithm=algorithm, headers={"typ": "at+jwt"})


def test_a_jwt_names_the_agent_and_forged_or_stale_tokens_are_refused(tmp_path, upstream, store_db):
    secret = tmp_path / "jwt.secret"
    secret.write_text(SECRET + "\n")
    gateway = gateway_with(tmp_path, upstream, "--identity-jwt", "--identity-jwt-secret-file", str(secret),
                           "--identity-jwt-algorithm", "HS256", "--identity-jwt-issuer", ISSUER,
                           "--identity-jwt-audience", AUDIENCE, "--identity-jwt-token-type", "at+jwt",
                           "--identity-jwt-user-claim", "act_for")
    bad = {
        "alg none": _token(algorithm="none"),
        "wrong audience": _token(aud="someone-else"),
        "expired": _token(exp=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1),
                          iat=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=2)),
    }
    try:
        said = "\n".join(banner(gateway))
        good = sdk_call(gateway.url, {"authorization": f"Bearer {_token()}"}, {"payment_id": "p1", "amount": 5})
        refused = {what: mcp_post(gateway.url, tools_call("refund", {"payment_id": f"x-{n}", "amount": 5}),
                                  headers={"authorization": f"Bearer {token}"})
                   for n, (what, token) in enumerate(bad.items())}
    finally:
        gateway.stop()
    assert "identity JWTIdentityProvider" in said and SECRET not in said
    assert good.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert agents() == ["agent-7"]
    for what, (status, answer) in refused.items():
        assert status == 403 and answer["error"]["code"] == -41007, what
        assert "credential rejected" in answer["error"]["message"], what
    assert len(executions(upstream)) == 1  # only the good token's call reached the tool


@pytest.mark.parametrize("arguments, says", [
    (["--identity-jwt-secret", "s3cret-s3cret-s3cret-s3cret-s3cret"], "--identity-jwt-secret-file"),
    (["--principal", "a", "--principal-header", "x-agent"], "exactly one of"),
    (["--user-header", "x-user", "--principal", "a"], "--user-header goes with --principal-header"),
    (["--identity-jwt", "--identity-jwt-jwks-url", "https://issuer.test/jwks"], "--identity-jwt-issuer"),
    (["--identity-jwt-secret-file", "/nonexistent/secret", "--identity-jwt-algorithm", "HS256",
      "--identity-jwt-issuer", ISSUER, "--identity-jwt-audience", AUDIENCE, "--identity-jwt-token-type", "at+jwt"],
     "cannot read it"),
])
def test_the_identity_flags_refuse_with_a_reason(tmp_path, store_db, arguments, says):
    done = subprocess.run([sys.executable, "-m", "ctrlrun", "gateway", "--upstream", "http://127.0.0.1:1/mcp",
                           "--alias", "pay", *arguments], cwd=tmp_path, env=script_environment(tmp_path, POLICY),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "s3cret" not in done.stderr
