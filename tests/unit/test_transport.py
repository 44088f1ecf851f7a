"""ctrlrun.transport against real local servers: a refused connect inside a scope is NotExecuted and
nothing else is, outside a scope nothing changes, and the register of bytes offered follows each
executor run (a second request, a plain thread, asyncio tasks, nested runs), for urllib,
http.client and httpx (sync and async)."""
from __future__ import annotations

import asyncio
import contextlib
import http.client
import ssl
import subprocess
import sys
import threading
import urllib.error

import httpx
import pytest

import ctrlrun
from ctrlrun import transport
from ctrlrun.transport import Transport, effect_state, executor_scope
from tests.transport_servers import answering, closed_port, closing_at_once, reading_then_closing, serve  # noqa: F401


def refused_url() -> str:
    return f"http://127.0.0.1:{closed_port()}/"


def assert_not_executed(error: BaseException, cause: type[BaseException]) -> None:
    assert type(error) is ctrlrun.NotExecuted
    assert "no byte of the request was sent before the connection failed" in str(error)
    assert "retry is safe" in str(error)
    assert type(error.__cause__) is cause
    assert error.observed is Transport.never_connected


# --------------------------------------------------------------------------- the table


def test_only_never_connected_is_failed():
    assert {member.name: effect_state(member).value for member in Transport} == {
        "never_connected": "failed",
        "after_request_sent": "ambiguous",
        "unreadable_response": "ambiguous",
        "stream_ended_early": "ambiguous",
        "client_disconnected": "ambiguous",
    }
    assert effect_state("never_connected") is ctrlrun.EffectState.FAILED
    with pytest.raises(ValueError):
        effect_state("connected_maybe")


# --------------------------------------------------------------------------- urllib and http.client


def test_refused_connect_is_not_executed_inside_a_scope_only():
    url = refused_url()
    with executor_scope(), pytest.raises(ctrlrun.NotExecuted) as caught:
        transport.urlopen(url, timeout=5)
    assert_not_executed(caught.value, ConnectionRefusedError)
    assert url.removeprefix("http://").rstrip("/") in str(caught.value)

    with pytest.raises(urllib.error.URLError) as plain:  # outside any scope: urllib's own error
        transport.urlopen(url, timeout=5)
    assert type(plain.value) is urllib.error.URLError and type(plain.value.reason) is ConnectionRefusedError


def test_http_connection_refused_is_not_executed_and_leaves_no_socket():
    port = closed_port()
    connection = transport.HTTPConnection("127.0.0.1", port, timeout=5)
    with executor_scope(), pytest.raises(ctrlrun.NotExecuted) as caught:
        connection.request("POST", "/refunds", body=b"{}")
    assert_not_executed(caught.value, ConnectionRefusedError)
    assert connection.sock is None
    with pytest.raises(ConnectionRefusedError):
        transport.HTTPConnection("127.0.0.1", port, timeout=5).request("GET", "/")


def test_server_that_read_the_request_and_closed_gives_the_original_error(serve):
    server = serve(reading_then_closing)
    with executor_scope(), pytest.raises(http.client.RemoteDisconnected):
        transport.urlopen(server.url + "refunds", data=b'{"amount": 50}', timeout=5)
    assert len(server.requests) == 1 and server.requests[0].endswith(b'{"amount": 50}')


def test_server_that_closed_before_reading_anything_is_not_not_executed(serve):
    """The connection was made; the request was offered to the socket after the server had closed."""
    server = serve(closing_at_once)
    connection = transport.HTTPConnection("127.0.0.1", server.port, timeout=5)
    with executor_scope():
        connection.connect()
        assert server.closed.wait(5)
        with pytest.raises(ConnectionError) as caught:  # RemoteDisconnected, a reset, a broken pipe
            connection.request("POST", "/refunds", body=b"{}")
            connection.getresponse()
        assert not isinstance(caught.value, ctrlrun.NotExecuted)
        with pytest.raises(urllib.error.URLError):  # and the run has offered bytes now
            transport.urlopen(refused_url(), timeout=5)
    assert server.requests == []


def test_an_http_status_is_never_not_executed(serve):
    server = serve(answering(500, b"boom"))
    with executor_scope():
        with pytest.raises(urllib.error.HTTPError) as caught:
            transport.urlopen(server.url, timeout=5)
        assert caught.value.code == 500 and caught.value.read() == b"boom"
        with pytest.raises(urllib.error.URLError) as later:
            transport.urlopen(refused_url(), timeout=5)
    assert type(later.value) is urllib.error.URLError


def test_a_refused_second_request_after_one_that_went_out_stays_plain(serve):
    server = serve(answering(200))
    with executor_scope():
        with transport.urlopen(server.url, data=b"charge", timeout=5) as reply:
            assert reply.status == 200
        with pytest.raises(urllib.error.URLError) as caught:
            transport.urlopen(refused_url(), timeout=5)
    assert type(caught.value.reason) is ConnectionRefusedError
    with executor_scope(), pytest.raises(ctrlrun.NotExecuted):  # the next run starts clean
        transport.urlopen(refused_url(), timeout=5)


def test_a_send_on_a_thread_without_scope_marks_every_open_scope(serve):
    server = serve(answering(200))
    worker_ready, sent, outcome = threading.Event(), threading.Event(), []

    def other_executor() -> None:  # a second executor run, on a thread of its own
        with executor_scope():
            worker_ready.set()
            sent.wait(5)
            try:
                transport.urlopen(refused_url(), timeout=5)
            except Exception as exc:  # noqa: BLE001 - the type is the result
                outcome.append(exc)

    def unscoped_send() -> None:
        with transport.urlopen(server.url, timeout=5) as reply:
            reply.read()
        try:
            transport.urlopen(refused_url(), timeout=5)
        except Exception as exc:  # noqa: BLE001
            outcome.append(exc)
        sent.set()

    other = threading.Thread(target=other_executor)
    other.start()
    assert worker_ready.wait(5)
    with executor_scope():
        plain = threading.Thread(target=unscoped_send)  # started by the executor: no context inherited
        plain.start()
        plain.join(10)
        with pytest.raises(urllib.error.URLError) as caught:
            transport.urlopen(refused_url(), timeout=5)
    other.join(10)
    assert type(caught.value) is urllib.error.URLError
    assert [type(exc) for exc in outcome] == [urllib.error.URLError, urllib.error.URLError]


async def raised(awaitable) -> BaseException:
    """The exception ``awaitable`` raises (it must raise one)."""
    try:
        await awaitable
    except Exception as exc:  # noqa: BLE001 - the type is the result
        return exc
    raise AssertionError("no exception: the closed port answered?")


def test_two_asyncio_tasks_in_their_own_scopes_do_not_share_bytes(serve):
    server = serve(answering(200))

    def scope(wanted: bool):
        return executor_scope() if wanted else contextlib.nullcontext()

    async def sender(done: asyncio.Event, own_scope: bool) -> int:
        with scope(own_scope):
            reply = await asyncio.to_thread(transport.urlopen, server.url, timeout=5)  # to_thread keeps the context
            reply.close()
            done.set()
            return reply.status

    async def refused(done: asyncio.Event, own_scope: bool) -> BaseException:
        with scope(own_scope):
            await done.wait()
            return await raised(asyncio.to_thread(transport.urlopen, refused_url(), timeout=5))

    async def gathered(own_scopes: bool) -> list:
        done = asyncio.Event()
        with scope(not own_scopes):  # the control: one scope around both
            return await asyncio.gather(sender(done, own_scopes), refused(done, own_scopes))

    status, error = asyncio.run(gathered(own_scopes=True))
    assert status == 200 and type(error) is ctrlrun.NotExecuted
    status, error = asyncio.run(gathered(own_scopes=False))
    assert status == 200 and type(error) is urllib.error.URLError


def test_nested_runs(serve):
    """An inner run starts clean; its bytes mark the outer run; and a NotExecuted that leaves a run
    that had sent is withdrawn (the original error again)."""
    server = serve(answering(200))
    with executor_scope():
        with executor_scope():
            transport.urlopen(server.url, timeout=5).close()
        with pytest.raises(urllib.error.URLError):
            transport.urlopen(refused_url(), timeout=5)

    inner: list[BaseException] = []
    with pytest.raises(ConnectionRefusedError) as caught:
        with executor_scope():  # the outer run sends first
            transport.urlopen(server.url, timeout=5).close()
            try:
                with executor_scope():  # the inner run is clean: its refused connect is NotExecuted
                    transport.urlopen(refused_url(), timeout=5)
            except ctrlrun.NotExecuted as exc:
                inner.append(exc)
                raise
    assert len(inner) == 1 and caught.value is inner[0].__cause__
    assert any("NotExecuted withdrawn" in note for note in caught.value.__notes__)


def test_a_not_executed_is_withdrawn_when_the_run_sends_after_it(serve):
    server = serve(answering(200))
    with pytest.raises(ConnectionRefusedError):
        with executor_scope():
            try:
                transport.urlopen(refused_url(), timeout=5)
            except ctrlrun.NotExecuted as exc:
                refused = exc
            transport.urlopen(server.url, timeout=5).close()  # e.g. another thread of the run, meanwhile
            raise refused
    with pytest.raises(ctrlrun.NotExecuted):  # one raised by the function itself is never touched
        with executor_scope():
            transport.urlopen(server.url, timeout=5).close()
            raise ctrlrun.NotExecuted("the remote said it refused")


def test_mark_offered_for_what_the_executor_did_elsewhere():
    with executor_scope():
        transport.mark_offered()
        with pytest.raises(urllib.error.URLError):
            transport.urlopen(refused_url(), timeout=5)


def test_a_failed_tls_handshake_is_never_connected(serve):
    """The handshake carries no request byte: a server that does not speak TLS fails it, and nothing of
    the request reached it."""
    def plain_http(server, conn) -> None:  # reads what comes (the ClientHello) and answers in plain HTTP
        server.requests.append(conn.recv(65536))
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    server = serve(plain_http)
    with executor_scope(), pytest.raises(ctrlrun.NotExecuted) as caught:
        transport.urlopen(f"https://127.0.0.1:{server.port}/", timeout=5, context=ssl.create_default_context())
    assert isinstance(caught.value.__cause__, ssl.SSLError)
    assert len(server.requests) == 1 and server.requests[0][:1] == b"\x16"  # a TLS handshake record, no request


def test_only_http_and_https():
    with pytest.raises(urllib.error.URLError, match="unknown url type"):
        transport.urlopen("file:///etc/hostname")


# --------------------------------------------------------------------------- httpx


def test_httpx_refused_connect(serve):
    url = refused_url()
    with httpx.Client(transport=transport.HTTPTransport()) as client:
        with executor_scope(), pytest.raises(ctrlrun.NotExecuted) as caught:
            client.post(url, content=b"{}")
        assert_not_executed(caught.value, httpx.ConnectError)
        with pytest.raises(httpx.ConnectError):
            client.get(url)


def test_httpx_failures_after_sending_and_statuses_stay_as_they_are(serve):
    closing, failing = serve(reading_then_closing), serve(answering(500))
    seen: list[str] = []
    with httpx.Client(transport=transport.HTTPTransport()) as client, executor_scope():
        with pytest.raises(httpx.RemoteProtocolError):
            client.post(closing.url, content=b"charge")
        assert client.get(failing.url, extensions={"trace": lambda event, info: seen.append(event)}).status_code == 500
        with pytest.raises(httpx.ConnectError):
            client.get(refused_url())
    assert "connection.connect_tcp.started" in seen and "http11.send_request_headers.started" in seen


def test_httpx_second_request_and_other_thread(serve):
    server = serve(answering(200))
    with httpx.Client(transport=transport.HTTPTransport()) as client:
        with executor_scope():
            assert client.get(server.url).status_code == 200
            with pytest.raises(httpx.ConnectError):
                client.get(refused_url())
        with executor_scope():
            thread = threading.Thread(target=lambda: client.get(server.url))
            thread.start()
            thread.join(10)
            with pytest.raises(httpx.ConnectError):
                client.get(refused_url())
        assert len(server.requests) == 2
        with executor_scope(), pytest.raises(ctrlrun.NotExecuted):
            client.get(refused_url())


def test_httpx_async_tasks_in_their_own_scopes(serve):
    server = serve(answering(200))

    async def main() -> tuple[list, BaseException]:
        async with httpx.AsyncClient(transport=transport.AsyncHTTPTransport()) as client:
            done = asyncio.Event()

            async def sender() -> int:
                with executor_scope():
                    status = (await client.post(server.url, content=b"charge")).status_code
                    done.set()
                    return status

            async def refused() -> BaseException:
                with executor_scope():
                    await done.wait()
                    return await raised(client.get(refused_url()))

            separate = await asyncio.gather(sender(), refused())
            with executor_scope():  # the control: one run that sent, then refused
                await client.get(server.url)
                return separate, await raised(client.get(refused_url()))

    (status, error), control = asyncio.run(main())
    assert status == 200 and type(error) is ctrlrun.NotExecuted and type(error.__cause__) is httpx.ConnectError
    assert type(control) is httpx.ConnectError


def test_without_httpx_the_module_still_imports_and_says_what_to_install():
    script = (
        "import sys\n"
        "sys.modules['httpx'] = None\n"  # import httpx now fails, as if not installed
        "import ctrlrun.transport as t\n"
        "assert 'httpx' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n"
        "    t.HTTPTransport\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'httpx>=0.27' (django-ctrlrun's httpx extra)" in done.stdout
    lazy = subprocess.run([sys.executable, "-c", "import sys, ctrlrun.transport; print('httpx' in sys.modules)"],
                          capture_output=True, text=True, timeout=60)
    assert lazy.stdout.strip() == "False", lazy.stderr
    with pytest.raises(AttributeError):
        transport.NoSuchTransport  # noqa: B018
