"""Certificate pins on the connection that carries the call (§E3, ``pinned_context``): with
``tls_cert_file`` the pinned certificates are the only trust anchors of every upstream connection
of a pinned call, and the peer's certificate digest is checked on the call's own connection right
after its TLS handshake, before a byte of the request is written. Real processes and sockets: the
SDK-built upstream behind a TLS proxy on loopback (certificates made with ``cryptography``),
``ctrlrun gateway``, the SDK's client."""
from __future__ import annotations

import pytest

from tests.support import (
    TLSProxy,
    executions,
    mcp_post,
    receipts,
    sdk_client_calls,
    self_signed,
    start_gateway,
    start_upstream,
    tools_call,
)

pytestmark = pytest.mark.slow


def policy(*pinned) -> str:
    digests = ", ".join(f'"{certificate.pin}"' for certificate in pinned)
    files = ", ".join(f'"{certificate.cert_file}"' for certificate in pinned)
    return ("schema: ctrlrun.policy/v8\nactions:\n  mcp.pay.refund:\n    effect: \"refund:{payment_id}\"\n"
            f"    decision: allow\n    upstream:\n      tls_cert_sha256: [{digests}]\n      tls_cert_file: [{files}]\n")


@pytest.fixture
def upstream(tmp_path):
    server = start_upstream(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def certs(tmp_path):
    return {name: self_signed(tmp_path, name) for name in ("pinned", "other")}


def through(tmp_path, upstream, served, pins):
    proxy = TLSProxy(upstream.port, served)
    return proxy, start_gateway(tmp_path, proxy.url, policy(*pins))


def test_the_pinned_certificate_is_trusted_on_every_connection_and_the_call_runs(tmp_path, upstream, certs, store_db):
    proxy, gateway = through(tmp_path, upstream, [certs["pinned"]], [certs["pinned"]])
    try:  # the SDK's client: initialize and tools/list relayed, then the pinned call
        names, done = sdk_client_calls(gateway.url, ("refund", {"payment_id": "p1", "amount": 5}))
    finally:
        gateway.stop()
        proxy.close()
    assert "refund" in names
    assert done.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert executions(upstream) == ["refund p1 5"]


def test_a_certificate_that_is_not_pinned_is_refused_at_the_pin_check(tmp_path, upstream, certs, store_db):
    proxy, gateway = through(tmp_path, upstream, [certs["other"]], [certs["pinned"]])
    try:
        status, answer = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p1", "amount": 5}))
    finally:
        gateway.stop()
        proxy.close()
    assert status == 403, answer
    assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (-41016, "upstream_mismatch")
    assert proxy.served == ["other"]  # the pin check's handshake only: no connection was made for the call
    assert [(r["result"], r["decision_reason"]) for r in receipts()] == [("denied", "upstream_mismatch")]
    assert executions(upstream) == []


def test_a_certificate_swapped_after_the_pin_check_is_refused_on_the_calls_own_connection(
        tmp_path, upstream, certs, store_db):
    # The pin check's connection sees the pinned certificate, the call's own connection another one.
    proxy, gateway = through(tmp_path, upstream, [certs["pinned"], certs["other"]], [certs["pinned"]])
    try:
        status, answer = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p1", "amount": 5}))
    finally:
        gateway.stop()
        proxy.close()
    assert status == 403, answer
    error = answer["error"]
    assert (error["code"], error["data"]["error"], error["data"]["reason"]) == (
        -41016, "ctrlrun.upstream_unpinned", "upstream_mismatch")
    assert proxy.served == ["pinned", "other"]
    # The handshake failed, so no byte of the request went: recorded failed (provably not executed).
    assert error["data"]["_meta"]["com.ctrlrun/receipt"]["result"] == "failed"
    assert [(r["result"], r["action"]) for r in receipts()] == [("failed", "mcp.pay.refund")]
    assert executions(upstream) == []


def test_a_leaf_signed_by_a_pinned_certificate_is_refused_before_the_request_is_written(
        tmp_path, upstream, certs, store_db):
    # The pinned authority signs a leaf whose own digest is not pinned: the handshake trusts it
    # (the pinned certificate is an anchor), the digest check on that connection refuses it.
    leaf = self_signed(tmp_path, "leaf", issuer=certs["other"])
    proxy, gateway = through(tmp_path, upstream, [certs["pinned"], leaf], [certs["pinned"], certs["other"]])
    try:
        status, answer = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p2", "amount": 5}))
    finally:
        gateway.stop()
        proxy.close()
    assert status == 403, answer
    assert (answer["error"]["code"], answer["error"]["data"]["reason"]) == (-41016, "upstream_mismatch")
    assert leaf.pin in answer["error"]["message"]
    assert proxy.served == ["pinned", "leaf"]
    assert [(r["result"], r["action"]) for r in receipts()] == [("failed", "mcp.pay.refund")]
    assert executions(upstream) == []
