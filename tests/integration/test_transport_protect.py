"""ctrlrun.transport under ``ctrlrun.protect``, against real local servers and the real store: a refused
connect leaves the record ``failed`` and its retry runs; a request that went out and got no reply
leaves it ``ambiguous`` and the retry is refused; so does a refused connect after a request that went
out, and an HTTP status. Needs the kernel to run every executor inside ``transport.executor_scope()``.
"""
from __future__ import annotations

import http.client
import urllib.error

import httpx
import pytest

import ctrlrun
from ctrlrun import transport
from ctrlrun.models import EffectRecord
from tests.support import receipts
from tests.transport_servers import answering, closed_port, reading_then_closing, serve  # noqa: F401

pytestmark = pytest.mark.usefixtures("store_db", "agent")


def state(key: str = "refund:txn_9") -> str:
    return EffectRecord.objects.get(pk=key).state


def refund_posting_to(targets: list[str], send):
    """stripe.refund that POSTs to each of ``targets`` (read at call time) with ``send(url, body)``."""

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id: str, amount: int) -> int:
        for url in targets:
            send(url, f'{{"payment": "{payment_id}", "amount": {amount}}}'.encode())
        return len(targets)

    return refund


def with_urllib(url: str, body: bytes) -> None:
    transport.urlopen(url, data=body, timeout=5).close()


def with_httpx(url: str, body: bytes) -> None:
    with httpx.Client(transport=transport.HTTPTransport(), timeout=5) as client:
        client.post(url, content=body).raise_for_status()


@pytest.mark.parametrize("send", [with_urllib, with_httpx], ids=["urllib", "httpx"])
def test_refused_connect_is_failed_and_the_retry_runs(serve, send):
    server = serve(answering(200))
    targets = [f"http://127.0.0.1:{closed_port()}/refunds"]
    refund = refund_posting_to(targets, send)
    with pytest.raises(ctrlrun.NotExecuted, match="no byte of the request was sent"):
        refund(payment_id="txn_9", amount=100)
    assert state() == "failed"
    assert "no byte of the request was sent" in EffectRecord.objects.get(pk="refund:txn_9").error

    targets[:] = [server.url + "refunds"]  # the remote is back: the retry is allowed, and runs once
    assert refund(payment_id="txn_9", amount=100) == 1
    assert state() == "committed" and len(server.requests) == 1
    assert [r["result"] for r in receipts()] == ["failed", "committed"]


@pytest.mark.parametrize(("send", "error"), [(with_urllib, http.client.RemoteDisconnected),
                                             (with_httpx, httpx.RemoteProtocolError)], ids=["urllib", "httpx"])
def test_request_sent_and_no_reply_is_ambiguous(serve, send, error):
    server = serve(reading_then_closing)
    refund = refund_posting_to([server.url + "refunds"], send)
    with pytest.raises(error):
        refund(payment_id="txn_9", amount=100)
    assert state() == "ambiguous" and len(server.requests) == 1
    with pytest.raises(ctrlrun.AmbiguousEffect):
        refund(payment_id="txn_9", amount=100)
    assert len(server.requests) == 1


@pytest.mark.parametrize(("send", "error"), [(with_urllib, urllib.error.URLError),
                                             (with_httpx, httpx.ConnectError)], ids=["urllib", "httpx"])
def test_refused_connect_after_a_request_that_went_out_is_ambiguous(serve, send, error):
    server = serve(answering(200))
    refund = refund_posting_to([server.url + "refunds", f"http://127.0.0.1:{closed_port()}/notify"], send)
    with pytest.raises(error) as caught:
        refund(payment_id="txn_9", amount=100)
    assert not isinstance(caught.value, ctrlrun.NotExecuted)
    assert state() == "ambiguous" and len(server.requests) == 1


@pytest.mark.parametrize(("send", "error"), [(with_urllib, urllib.error.HTTPError),
                                             (with_httpx, httpx.HTTPStatusError)], ids=["urllib", "httpx"])
def test_an_http_status_is_ambiguous(serve, send, error):
    server = serve(answering(503))
    refund = refund_posting_to([server.url + "refunds"], send)
    with pytest.raises(error):
        refund(payment_id="txn_9", amount=100)
    assert state() == "ambiguous"


def test_each_run_has_its_own_register(serve):
    """One protected call's bytes do not spoil the next call's classification."""
    server = serve(answering(200))
    assert refund_posting_to([server.url], with_urllib)(payment_id="txn_1", amount=100) == 1
    with pytest.raises(ctrlrun.NotExecuted):
        refund_posting_to([f"http://127.0.0.1:{closed_port()}/"], with_urllib)(payment_id="txn_2", amount=100)
    assert state("refund:txn_1") == "committed" and state("refund:txn_2") == "failed"
