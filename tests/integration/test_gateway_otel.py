"""The gateway's OpenTelemetry (``--otel``, §E1/§F4): the gateway's ASGI application served by uvicorn on
loopback in this process (so the SDK's InMemorySpanExporter is read here), an SDK-built upstream in its
own process that records its own server spans and the ``traceparent`` headers it got; ``ctrlrun
gateway`` itself as a process for its flags and its exporter set-up."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ctrlrun.control import Control
from ctrlrun.errors import InvalidArgument
from ctrlrun.gateway import GatewayApp, fixed_principal, mount
from ctrlrun.gateway import tracing
from tests.support import (
    Misbehaving,
    ServedApp,
    executions,
    free_port,
    mcp_post,
    run_command,
    script_environment,
    sdk_client_calls,
    start_upstream,
    tools_call,
    wait_for_port,
)

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.pay.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: deny
  mcp.pay.broken:
    decision: allow
  mcp.pay.drop:
    effect: "drop:{payment_id}"
    decision: allow
"""

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
META_TRACE, META_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest.fixture
def spans_file(tmp_path):
    return tmp_path / "upstream-spans.jsonl"


@pytest.fixture
def upstream(tmp_path, spans_file):
    server = start_upstream(tmp_path, spans=spans_file)
    yield server
    server.stop()


@pytest.fixture
def gateway(store_db, use_policy):
    """``gateway(upstream_url, policy=POLICY, **options)``: a served GatewayApp and the exporter its spans go to."""
    made = []

    def serve(upstream_url, policy=POLICY, **options):
        path = use_policy(policy)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        app = GatewayApp(upstream=upstream_url, alias="pay", principal=fixed_principal("agent-1"),
                         control=Control(path), tracer_provider=provider, **options)
        served = ServedApp(app)
        made.append((served, app))
        return served, exporter

    yield serve
    for served, app in made:
        served.stop()
        app.close()


def upstream_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def only_span(exporter):
    span, = exporter.get_finished_spans()
    return span


def test_an_allowed_call_is_one_ok_server_span_with_mcp_attributes_and_no_argument_values(gateway, upstream, spans_file):
    served, exporter = gateway(upstream.url, otel=True)
    _, answer = sdk_client_calls(served.url, ("refund", {"payment_id": "p1", "amount": 300}))
    assert answer.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert executions(upstream) == ["refund p1 300"]
    span = only_span(exporter)  # tools/list is relayed: no span of its own
    assert (span.name, span.kind, span.status.status_code) == ("mcp.pay.refund", SpanKind.SERVER, StatusCode.OK)
    attributes = dict(span.attributes)
    assert {key: attributes.get(key) for key in (
        "mcp.method.name", "gen_ai.operation.name", "gen_ai.tool.name", "mcp.protocol.version",
        "ctrlrun.gateway.alias", "ctrlrun.gateway.upstream", "network.transport", "client.address",
        "ctrlrun.action.name", "ctrlrun.result", "ctrlrun.decision", "ctrlrun.effect_key",
        "ctrlrun.principal.agent")} == {
        "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "refund",
        "mcp.protocol.version": "2026-07-28", "ctrlrun.gateway.alias": "pay", "ctrlrun.gateway.upstream": upstream.url,
        "network.transport": "tcp", "client.address": "127.0.0.1", "ctrlrun.action.name": "mcp.pay.refund",
        "ctrlrun.result": "committed", "ctrlrun.decision": "allow", "ctrlrun.effect_key": "refund:p1",
        "ctrlrun.principal.agent": "agent-1"}
    assert attributes["jsonrpc.request.id"].isdigit()  # the SDK client's own request id, as a string
    assert attributes["ctrlrun.receipt_id"] == answer.meta["com.ctrlrun/receipt"]["receipt_id"]
    assert "error.type" not in attributes and "rpc.response.status_code" not in attributes
    assert not [key for key in attributes if key.startswith("ctrlrun.argument.") or key == "gen_ai.tool.call.arguments"]
    assert 300 not in attributes.values()
    # the upstream's own server span (the SDK's) is a child of the gateway's span, in its trace
    server_span = next(r for r in upstream_records(spans_file)
                       if r.get("span") == "tools/call refund")
    assert server_span["trace_id"] == f"{span.context.trace_id:032x}"
    assert server_span["parent_id"] == f"{span.context.span_id:016x}"


def test_otel_arguments_adds_the_argument_values(gateway, upstream):
    served, exporter = gateway(upstream.url, otel=True, otel_arguments=True)
    status, body = mcp_post(served.url, tools_call("refund", {"payment_id": "p7", "amount": 250}, request_id=41),
                            headers={"mcp-session-id": "session-abc"})
    assert status == 200 and body["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed"
    attributes = dict(only_span(exporter).attributes)
    assert (attributes["ctrlrun.argument.payment_id"], attributes["ctrlrun.argument.amount"]) == ("p7", 250)
    assert json.loads(attributes["gen_ai.tool.call.arguments"]) == {"payment_id": "p7", "amount": 250}
    assert (attributes["jsonrpc.request.id"], attributes["mcp.session.id"]) == ("41", "session-abc")


def test_a_denied_call_reaches_no_upstream_and_its_span_names_the_refusal(gateway, upstream, spans_file):
    served, exporter = gateway(upstream.url, otel=True)
    status, body = mcp_post(served.url, tools_call("refund", {"payment_id": "p9", "amount": 10**7}))
    assert (status, body["error"]["code"]) == (403, -41001)
    assert executions(upstream) == []
    assert not [r for r in upstream_records(spans_file) if r.get("header")]
    span = only_span(exporter)
    assert span.name == "mcp.pay.refund" and span.kind == SpanKind.SERVER
    assert span.status.status_code == StatusCode.UNSET  # §F4: a refusal is not an error
    assert (span.attributes["ctrlrun.result"], span.attributes["ctrlrun.decision_reason"]) == ("denied", "rule[1]")
    assert span.attributes["rpc.response.status_code"] == "-41001"  # what the client was told
    assert "error.type" not in span.attributes
    assert [event.name for event in span.events][0] == "ACTION_PROPOSED"


def test_a_dropped_socket_is_an_ambiguous_error_span_and_an_is_error_a_tool_error(gateway):
    bad = Misbehaving()
    try:
        served, exporter = gateway(bad.url, otel=True)
        status, body = mcp_post(served.url, tools_call("drop", {"payment_id": "d1"}))
        assert (status, body["error"]["code"]) == (502, -41010)
        assert bad.calls == ["drop"]
        span = only_span(exporter)
        assert (span.name, span.status.status_code) == ("mcp.pay.drop", StatusCode.ERROR)
        assert "may have run" in span.status.description
        assert span.attributes["ctrlrun.result"] == "ambiguous"
        assert span.attributes["error.type"] == span.attributes["rpc.response.status_code"] == "-41010"
    finally:
        bad.close()


def test_an_upstream_is_error_is_a_tool_error(gateway, upstream):
    served, exporter = gateway(upstream.url, otel=True)
    status, body = mcp_post(served.url, tools_call("broken", {"payment_id": "b1"}))
    assert status == 200 and body["result"]["isError"] is True
    span = only_span(exporter)
    assert (span.status.status_code, span.attributes["ctrlrun.result"]) == (StatusCode.ERROR, "ambiguous")
    assert span.attributes["error.type"] == "tool_error" and "rpc.response.status_code" not in span.attributes


def test_the_client_trace_runs_through_the_gateway_to_the_upstream(gateway, upstream, spans_file):
    """A traceparent header: the gateway's span continues it, and the upstream (its HTTP header and its
    SDK's span, which reads params._meta) sees the gateway's span as the parent, not the client's."""
    served, exporter = gateway(upstream.url, otel=True)
    status, _ = mcp_post(served.url, tools_call("refund", {"payment_id": "t1", "amount": 10}),
                         headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert status == 200
    span = only_span(exporter)
    assert f"{span.context.trace_id:032x}" == CLIENT_TRACE and f"{span.parent.span_id:016x}" == CLIENT_SPAN
    mine = f"00-{CLIENT_TRACE}-{span.context.span_id:016x}-01"
    records = upstream_records(spans_file)
    assert [r["header"] for r in records if r.get("mcp_name") == "refund"] == [mine]
    server_span = next(r for r in records if r.get("span") == "tools/call refund")
    assert (server_span["trace_id"], server_span["parent_id"]) == (CLIENT_TRACE, f"{span.context.span_id:016x}")


def test_params_meta_traceparent_is_the_parent_and_the_header_a_link(gateway, upstream, spans_file):
    served, exporter = gateway(upstream.url, otel=True)
    message = tools_call("refund", {"payment_id": "t2", "amount": 10})
    message["params"]["_meta"]["traceparent"] = f"00-{META_TRACE}-{META_SPAN}-01"
    status, _ = mcp_post(served.url, message, headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert status == 200
    span = only_span(exporter)
    assert (f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}") == (META_TRACE, META_SPAN)
    link, = span.links
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == (CLIENT_TRACE, CLIENT_SPAN)
    server_span = next(r for r in upstream_records(spans_file) if r.get("span") == "tools/call refund")
    assert (server_span["trace_id"], server_span["parent_id"]) == (META_TRACE, f"{span.context.span_id:016x}")


def test_without_otel_nothing_is_traced_and_the_client_context_is_passed_on_as_sent(gateway, upstream, spans_file):
    served, exporter = gateway(upstream.url)
    header = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    assert mcp_post(served.url, tools_call("refund", {"payment_id": "t3", "amount": 10}),
                    headers={"traceparent": header})[0] == 200
    assert exporter.get_finished_spans() == ()
    assert [r["header"] for r in upstream_records(spans_file) if r.get("mcp_name") == "refund"] == [header]


@pytest.mark.parametrize("hostile", ["00-zz-00-01", "ff-" + "0" * 32 + "-" + "0" * 16 + "-01", "x" * 10_000, 7, {"a": 1}])
def test_a_hostile_traceparent_is_ignored_and_the_call_goes_on(gateway, upstream, hostile):
    served, exporter = gateway(upstream.url, otel=True)
    message = tools_call("refund", {"payment_id": f"h{len(str(hostile))}", "amount": 10})
    message["params"]["_meta"]["traceparent"] = hostile
    headers = {"traceparent": hostile} if isinstance(hostile, str) else {}
    status, body = mcp_post(served.url, message, headers=headers)
    assert status == 200 and body["result"]["_meta"]["com.ctrlrun/receipt"]["result"] == "committed"
    span = only_span(exporter)
    assert span.parent is None and span.status.status_code == StatusCode.OK  # a trace of its own


def test_concurrent_calls_keep_their_own_attributes_and_other_calls_of_the_process_get_no_span(gateway, upstream,
                                                                                              use_policy):
    from concurrent.futures import ThreadPoolExecutor

    served, exporter = gateway(upstream.url, otel=True)

    def call(number):
        return mcp_post(served.url, tools_call("refund", {"payment_id": f"c{number}", "amount": number},
                                               request_id=number), headers={"mcp-session-id": f"s{number}"})

    with ThreadPoolExecutor(4) as pool:
        assert [status for status, _ in pool.map(call, range(1, 9))] == [200] * 8
    seen = {(s.attributes["jsonrpc.request.id"], s.attributes["mcp.session.id"], s.attributes["ctrlrun.effect_key"])
            for s in exporter.get_finished_spans()}
    assert seen == {(str(n), f"s{n}", f"refund:c{n}") for n in range(1, 9)}
    exporter.clear()
    Control(use_policy(POLICY)).call("mcp.pay.refund", {"payment_id": "direct", "amount": 1}, lambda: "ok",
                                     principal="agent-1")  # not through the gateway: not its span
    assert exporter.get_finished_spans() == ()


def test_credentials_in_the_upstream_url_stay_off_the_span(gateway, upstream):
    secret_url = f"http://user:s3cret@127.0.0.1:{upstream.port}/mcp?token=t0ken"
    served, exporter = gateway(secret_url, otel=True, otel_arguments=True)
    assert mcp_post(served.url, tools_call("refund", {"payment_id": "u1", "amount": 3}))[0] == 200
    span = only_span(exporter)
    assert span.attributes["ctrlrun.gateway.upstream"] == upstream.url
    assert not [value for value in span.attributes.values() if "s3cret" in str(value) or "t0ken" in str(value)]


def test_a_float_refused_by_the_gateway_itself_has_its_span(gateway, upstream):
    served, exporter = gateway(upstream.url, otel=True)
    status, body = mcp_post(served.url, tools_call("refund", {"payment_id": "f1", "amount": 1.5}))
    assert (status, body["error"]["code"]) == (400, -41008)
    span = only_span(exporter)
    assert (span.attributes["ctrlrun.result"], span.attributes["rpc.response.status_code"]) == ("denied", "-41008")
    assert executions(upstream) == []


def test_otel_arguments_without_otel_is_refused(store_db):
    with pytest.raises(InvalidArgument, match="goes with otel=True"):
        GatewayApp(upstream="http://127.0.0.1:9/mcp", alias="pay", otel_arguments=True)
    with pytest.raises(InvalidArgument, match="goes with otel=True"):
        mount(lambda scope, receive, send: None, GatewayApp(upstream="http://127.0.0.1:9/mcp", alias="pay"),
              otel_arguments=True)


def test_mount_traces_the_gateway_it_mounts(gateway, upstream, use_policy):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = GatewayApp(upstream=upstream.url, alias="pay", principal=fixed_principal("agent-1"),
                     control=Control(use_policy(POLICY)))

    async def django(scope, receive, send):  # the project's own application, for every other path
        raise AssertionError("the gateway's path reached the project's application")

    served = ServedApp(mount(django, app, otel=True, otel_arguments=True, tracer_provider=provider))
    try:
        assert mcp_post(served.url, tools_call("refund", {"payment_id": "m1", "amount": 5}))[0] == 200
    finally:
        served.stop()
        app.close()
    span = only_span(exporter)
    assert (span.name, span.attributes["ctrlrun.argument.payment_id"]) == ("mcp.pay.refund", "m1")


def test_the_attribute_names_are_the_installed_semantic_conventions():
    for module, names in tracing.SEMCONV.items():
        for place in ("opentelemetry.semconv.attributes", "opentelemetry.semconv._incubating.attributes"):
            try:
                found = importlib.import_module(f"{place}.{module}")
            except ImportError:
                continue
            if all(hasattr(found, constant) for constant in names):
                break
        assert {constant: getattr(found, constant) for constant in names} == names


# ---------------------------------------------------------------- ctrlrun gateway --otel


def gateway_command(tmp_path, *flags, env=None):
    environment = {**script_environment(tmp_path, POLICY), **(env or {})}
    return subprocess.run([sys.executable, "-m", "ctrlrun", "gateway", "--upstream", "http://127.0.0.1:9/mcp",
                           "--alias", "pay", "--principal", "agent-1", "--listen", f"127.0.0.1:{free_port()}", *flags],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)


def test_the_command_refuses_otel_arguments_without_otel(tmp_path, store_db):
    done = gateway_command(tmp_path, "--otel-arguments")
    assert done.returncode == 2
    assert done.stderr.startswith("Error: --otel-arguments goes with --otel") and "Traceback" not in done.stderr
    with pytest.raises(Exception, match="--otel-arguments goes with --otel"):
        run_command("mcp_gateway", "--upstream", "http://127.0.0.1:9/mcp", "--alias", "pay", "--principal", "a",
                    "--otel-arguments")


def test_the_command_without_an_exporter_says_what_to_install(tmp_path, store_db):
    assert not list(entry_points(group="opentelemetry_traces_exporter", name="otlp_proto_http")), \
        "this test expects no OTLP exporter installed; with one, --otel starts"
    env = {"OTEL_TRACES_EXPORTER": ""}
    done = gateway_command(tmp_path, "--otel", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("Error: --otel: the span exporter 'otlp_proto_http' (OTEL_TRACES_EXPORTER=otlp) "
                                  "is not installed: pip install 'django-ctrlrun[otel]' "
                                  "opentelemetry-exporter-otlp-proto-http, or set OTEL_TRACES_EXPORTER")
    done = gateway_command(tmp_path, "--otel", env={"OTEL_TRACES_EXPORTER": "console,zipkin"})
    assert done.returncode == 2 and "'zipkin' (OTEL_TRACES_EXPORTER=zipkin) is not installed" in done.stderr
    done = gateway_command(tmp_path, "--otel", env={"OTEL_TRACES_EXPORTER": "otlp",
                                                    "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})
    assert done.returncode == 2 and "the OTLP protocol 'carrier-pigeon' is not supported" in done.stderr


def test_the_command_exports_through_the_otel_environment(tmp_path, store_db, upstream):
    port = free_port()
    env = {**script_environment(tmp_path, POLICY), "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "gw-test"}
    proc = subprocess.Popen([sys.executable, "-m", "ctrlrun", "gateway", "--upstream", upstream.url, "--alias", "pay",
                             "--principal", "agent-1", "--listen", f"127.0.0.1:{port}", "--otel"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, proc)
        assert mcp_post(f"http://127.0.0.1:{port}/mcp", tools_call("refund", {"payment_id": "c1", "amount": 5}))[0] == 200
    finally:
        proc.terminate()  # uvicorn stops; the provider's shutdown flushes the batch of spans
        out, err = proc.communicate(timeout=60)
    assert "otel: spans to console, service gw-test" in out
    assert '"name": "mcp.pay.refund"' in out and '"ctrlrun.result": "committed"' in out, err



def test_every_tools_call_has_a_span_waiting_re_sent_approved_or_refused_by_the_gateway(gateway, upstream):
    """A call sent for approval has no receipt yet: its span ends with the answer (-41002). A re-sent call
    still waiting, or a malformed one, is answered by the gateway before any action: a span of its own."""
    policy = POLICY.replace("      - decision: deny\n", "      - decision: approve\n", 1)
    served, exporter = gateway(upstream.url, policy=policy, otel=True)
    status, body = mcp_post(served.url, tools_call("refund", {"payment_id": "a1", "amount": 5000}))
    assert (status, body["error"]["code"]) == (403, -41002)
    waiting = only_span(exporter)
    assert (waiting.name, waiting.status.status_code) == ("mcp.pay.refund", StatusCode.UNSET)
    assert waiting.attributes["rpc.response.status_code"] == "-41002" and "ctrlrun.action_id" in waiting.attributes
    exporter.clear()
    assert mcp_post(served.url, tools_call("refund", {"payment_id": "a1", "amount": 5000}, request_id=2))[1][
        "error"]["code"] == -41002
    again = only_span(exporter)
    assert (again.name, again.status.status_code, again.attributes["jsonrpc.request.id"]) == (
        "mcp.pay.refund", StatusCode.UNSET, "2")
    assert again.attributes["rpc.response.status_code"] == "-41002" and "ctrlrun.action_id" not in again.attributes
    exporter.clear()
    run_command("approve", body["error"]["data"]["request_id"], "--by", "ana")
    status, answer = mcp_post(served.url, tools_call("refund", {"payment_id": "a1", "amount": 5000}, request_id=3))
    assert status == 200
    granted = only_span(exporter)
    assert (granted.status.status_code, granted.attributes["ctrlrun.result"]) == (StatusCode.OK, "committed")
    assert granted.attributes["ctrlrun.approval_id"] == body["error"]["data"]["request_id"]
    exporter.clear()
    status, _ = mcp_post(served.url, {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"arguments": {}}},
                         headers={"mcp-name": None, "mcp-protocol-version": "2025-06-18"})
    assert status == 400
    malformed = only_span(exporter)
    assert (malformed.name, malformed.status.status_code, malformed.attributes["error.type"]) == (
        "tools/call", StatusCode.ERROR, "-32602")
    assert executions(upstream) == ["refund a1 5000"]
