"""Webhook approvals (§D6): the signed request delivered to a receiver on loopback, and the signed
answer taken by the Django view, every forged, stale or mismatched answer refused and nothing changed."""
from __future__ import annotations

import json
import time

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.errors import InvalidArgument
from ctrlrun.webhook import SCHEMA, WebhookApprovalProvider, handle_inbound, sign, verify, webhook_secret
from tests.support import Receiver

SECRET = b"s" * 40
pytestmark = pytest.mark.usefixtures("store_db")


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(**options) -> Receiver:
        made.append(Receiver(**options))
        return made[-1]

    yield make
    for one in made:
        one.close()


def _ask(control: Control, payment_id: str = "txn_w1") -> str:
    with ctrlrun.context(agent="support-agent", user="dana"):
        with pytest.raises(ctrlrun.ApprovalRequired) as caught:
            control.call("stripe.refund", {"payment_id": payment_id, "amount": 60000}, lambda: "refunded",
                         effect="refund:{payment_id}")
    return caught.value.request_id


def _answer(request_id: str, decision: str = "grant", approver: str = "slack:U123", **changes) -> bytes:
    view = store.get_approval(request_id)
    document = {"request_id": request_id, "action_hash": view.action_hash, "decision": decision, "approver": approver}
    document.update(changes)
    return json.dumps(document).encode()


def _post(client, request_id: str, body: bytes, signature: str | None):
    headers = {"HTTP_CTRLRUN_SIGNATURE": signature} if signature is not None else {}
    return client.post(f"/ctrlrun/approvals/{request_id}", body, content_type="application/json", **headers)


# --------------------------------------------------------------------------- signing


def test_a_signature_verifies_inside_its_window_only_and_never_for_other_bytes():
    header = sign(b"{}", SECRET, at=1_000_000)
    assert header.startswith("t=1000000,v1=")
    assert verify(header, b"{}", SECRET, 300, now=1_000_299)
    assert verify(header, b"{}", SECRET, 300, now=999_701)  # a sender's clock ahead
    assert not verify(header, b"{}", SECRET, 300, now=1_000_301)
    assert not verify(header, b"{ }", SECRET, 300, now=1_000_000)
    assert not verify(header, b"{}", b"t" * 40, 300, now=1_000_000)
    for broken in (None, "", "t=,v1=", "v1=abc", "t=1000000", "t=1e6,v1=" + header[13:], "x" * 5000):
        assert not verify(broken, b"{}", SECRET, 300, now=1_000_000)


def test_a_short_or_missing_secret_is_refused_with_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(InvalidArgument, match="at least 32 bytes"):
        sign(b"{}", b"short")
    monkeypatch.delenv("CTRLRUN_WEBHOOK_SECRET", raising=False)
    with pytest.raises(InvalidArgument, match="CTRLRUN_WEBHOOK_SECRET"):
        webhook_secret()
    monkeypatch.setenv("CTRLRUN_WEBHOOK_SECRET", "  ")
    with pytest.raises(InvalidArgument, match="set but empty"):
        webhook_secret()
    (tmp_path / "secret").write_bytes(b"\n")
    with pytest.raises(InvalidArgument, match="is empty"):
        webhook_secret(tmp_path / "secret")
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    assert webhook_secret(tmp_path / "secret") == SECRET


def test_only_https_or_loopback_http_when_allowed(receiver):
    with pytest.raises(InvalidArgument, match="not https"):
        WebhookApprovalProvider(url="http://127.0.0.1:9/hook", secret=SECRET)
    with pytest.raises(InvalidArgument, match="not loopback"):
        WebhookApprovalProvider(url="http://example.com/hook", secret=SECRET, allow_insecure=True)
    with pytest.raises(InvalidArgument, match="https URL"):
        WebhookApprovalProvider(url="ftp://example.com/hook", secret=SECRET)
    WebhookApprovalProvider(url="https://hooks.example.com/x", secret=SECRET)


# --------------------------------------------------------------------------- outbound


def test_the_request_is_recorded_then_delivered_signed_with_its_exact_body(receiver):
    hook = receiver()
    provider = WebhookApprovalProvider(url=hook.url, secret=SECRET, allow_insecure=True,
                                       public_url="https://ops.example.com/")
    request_id = _ask(Control(approvals=provider))
    assert provider.drain(10) and provider.delivered == [(request_id, "delivered")]
    (headers, body), = hook.posts
    signature = {k.lower(): v for k, v in headers.items()}["ctrlrun-signature"]
    assert verify(signature, body, SECRET, 300)
    document = json.loads(body)
    view = store.get_approval(request_id)
    assert list(document) == ["schema", "request_id", "action_hash", "action", "created_at", "expires_at", "respond_to"]
    assert document["schema"] == SCHEMA and document["action_hash"] == view.action_hash
    assert document["action"] == {"name": "stripe.refund", "arguments": {"amount": 60000, "payment_id": "txn_w1"},
                                  "principal": {"agent": "support-agent", "user": "dana"}, "resource": None,
                                  "environment": "production"}
    assert document["respond_to"] == f"https://ops.example.com/ctrlrun/approvals/{request_id}"
    assert b" " not in body.replace(b"support-agent", b"")  # compact


def test_a_failing_receiver_is_retried_then_the_request_stays_pending(receiver, caplog):
    hook = receiver(status=503)
    provider = WebhookApprovalProvider(url=hook.url, secret=SECRET, allow_insecure=True, retries=2, backoff=0.01)
    request_id = _ask(Control(approvals=provider))
    assert provider.drain(10)
    assert len(hook.posts) == 3 and provider.delivered == [(request_id, "failed")]
    assert store.get_approval(request_id).status == "pending"
    assert f"ctrlrun approve {request_id}" in caplog.text


def test_a_flaky_receiver_gets_it_on_a_retry(receiver):
    hook = receiver(fail_first=1)
    provider = WebhookApprovalProvider(url=hook.url, secret=SECRET, allow_insecure=True, retries=2, backoff=0.01)
    request_id = _ask(Control(approvals=provider))
    assert provider.drain(10) and provider.delivered == [(request_id, "delivered")] and len(hook.posts) == 2


def test_a_redirect_is_refused_never_followed(receiver):
    target = receiver()
    hook = receiver(status=307, location=target.url)
    provider = WebhookApprovalProvider(url=hook.url, secret=SECRET, allow_insecure=True, retries=0)
    request_id = _ask(Control(approvals=provider))
    assert provider.drain(10) and provider.delivered == [(request_id, "failed")]
    assert target.posts == []


def test_a_receiver_that_never_answers_does_not_hold_the_agent(receiver):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        provider = WebhookApprovalProvider(url=f"http://127.0.0.1:{silent.getsockname()[1]}/", secret=SECRET,
                                           allow_insecure=True, timeout=2, retries=0)
        started = time.monotonic()
        request_id = _ask(Control(approvals=provider))
        assert time.monotonic() - started < 1.5  # the call returned before the delivery's timeout
        assert provider.drain(10) and provider.delivered == [(request_id, "failed")]
    finally:
        silent.close()


# --------------------------------------------------------------------------- inbound


@pytest.fixture
def answers(settings, tmp_path):
    (tmp_path / "webhook-secret").write_bytes(SECRET)
    settings.CTRLRUN_WEBHOOK_SECRET_FILE = str(tmp_path / "webhook-secret")


def test_a_signed_answer_grants_and_the_call_then_runs_under_it(client, answers):
    control = Control()
    request_id = _ask(control)
    body = _answer(request_id)
    response = _post(client, request_id, body, sign(body, SECRET))
    assert (response.status_code, response.content) == (200, b"ok\n")
    again = _post(client, request_id, body, sign(body, SECRET))
    assert (again.status_code, again.content) == (200, b"already granted\n")
    view = store.get_approval(request_id)
    assert (view.status, view.approver) == ("granted", "slack:U123")
    with ctrlrun.context(agent="support-agent", user="dana"), ctrlrun.with_approval(request_id):
        assert control.call("stripe.refund", {"payment_id": "txn_w1", "amount": 60000}, lambda: "refunded",
                            effect="refund:{payment_id}") == "refunded"
    assert store.get_approval(request_id).status == "consumed"
    again = _post(client, request_id, body, sign(body, SECRET))
    assert again.content == b"already granted\n"


def test_a_deny_then_a_grant_is_refused(client, answers):
    request_id = _ask(Control())
    deny = _answer(request_id, "deny")
    assert _post(client, request_id, deny, sign(deny, SECRET)).content == b"ok\n"
    grant = _answer(request_id, "grant")
    response = _post(client, request_id, grant, sign(grant, SECRET))
    assert response.status_code == 400 and store.get_approval(request_id).status == "denied"


@pytest.mark.parametrize("forgery", ["bad signature", "stale", "no signature", "other request", "other hash",
                                     "not json", "not an object", "bad decision", "no approver", "unknown request",
                                     "huge", "deep"])
def test_every_forged_or_mismatched_answer_is_a_400_that_changes_nothing(client, answers, forgery):
    request_id = _ask(Control())
    other_id = _ask(Control(), "txn_w2")
    body = _answer(request_id)
    signature = sign(body, SECRET)
    path_id = request_id
    if forgery == "bad signature":
        signature = sign(body, b"x" * 40)
    elif forgery == "stale":
        signature = sign(body, SECRET, at=time.time() - 301)
    elif forgery == "no signature":
        signature = None
    elif forgery == "other request":
        path_id = other_id
    elif forgery == "other hash":
        body = _answer(request_id, action_hash=store.get_approval(other_id).action_hash)
    elif forgery == "not json":
        body = b"{grant"
    elif forgery == "not an object":
        body = b'["grant"]'
    elif forgery == "bad decision":
        body = _answer(request_id, "approve")
    elif forgery == "no approver":
        body = _answer(request_id, approver="  ")
    elif forgery == "unknown request":
        path_id = "apr_nope"
        body = _answer(request_id).replace(request_id.encode(), b"apr_nope")
    elif forgery == "huge":
        body = _answer(request_id, approver="x" * 70_000)
    elif forgery == "deep":
        body = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    if forgery not in ("bad signature", "stale", "no signature"):
        signature = sign(body, SECRET)
    response = _post(client, path_id, body, signature)
    assert response.status_code == 400, response.content
    assert b"Traceback" not in response.content
    assert {store.get_approval(request_id).status, store.get_approval(other_id).status} == {"pending"}


def test_without_a_secret_the_endpoint_refuses_everything(client, settings, monkeypatch):
    settings.CTRLRUN_WEBHOOK_SECRET_FILE = None
    monkeypatch.delenv("CTRLRUN_WEBHOOK_SECRET", raising=False)
    request_id = _ask(Control())
    body = _answer(request_id)
    response = _post(client, request_id, body, sign(body, SECRET))
    assert response.status_code == 503 and store.get_approval(request_id).status == "pending"
    assert client.get(f"/ctrlrun/approvals/{request_id}").status_code == 405


def test_the_requester_cannot_answer_their_own_request_through_the_webhook(answers):
    request_id = _ask(Control())
    body = _answer(request_id, approver="dana")
    status, text = handle_inbound(request_id, body, sign(body, SECRET), secret=SECRET)
    assert status == 400 and "dana" in text and store.get_approval(request_id).status == "pending"


def test_an_async_call_is_announced_the_same_way(receiver):
    import asyncio

    hook = receiver()
    provider = WebhookApprovalProvider(url=hook.url, secret=SECRET, allow_insecure=True)
    control = Control(approvals=provider)

    async def ask():
        with ctrlrun.context(agent="support-agent", user="dana"):
            with pytest.raises(ctrlrun.ApprovalRequired) as caught:
                await control.acall("stripe.refund", {"payment_id": "txn_a1", "amount": 60000}, lambda: "refunded",
                                    effect="refund:{payment_id}")
        return caught.value.request_id

    request_id = asyncio.run(ask())
    assert provider.drain(10) and provider.delivered == [(request_id, "delivered")]
    assert json.loads(hook.posts[0][1])["request_id"] == request_id
    from django.db import connection

    from ctrlrun.testing import close_store_threads
    from tests.support import evidence_guard

    close_store_threads()
    evidence_guard().remove(connection)
