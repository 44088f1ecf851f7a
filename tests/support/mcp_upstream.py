"""An MCP server built with the SDK (``MCPServer``), run as its own OS process on loopback:
``python -m tests.support.mcp_upstream PORT LOG [TOOL_NAME [VARIANT]]`` (``reschemed``: ``refund``
described differently, so its ``tools/list`` entry changes; ``elicit``: ``confirmed_refund`` too;
``wide``: two more tools, ``lookup`` and ``purge``, for the tests of ``--hide-denied-tools``).

``refund`` (or ``TOOL_NAME``: the tool renamed) appends one line per execution to LOG, so a test
counts how often each key really ran; ``slow_refund`` writes its line and then waits, so a test can
kill this process in the middle of a call; ``broken`` answers ``isError``; ``confirmed_refund`` (variant
``elicit``) asks its client two questions (MCP elicitation, ``input_required`` with a
``requestState``: is it meant, and why) and refunds on the third leg, naming the answers.
``CTRLRUN_TEST_SPANS=FILE`` records the SDK's server spans and the ``traceparent`` headers it was sent
(``traced``).
"""
from __future__ import annotations

import os
import sys
import time

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult


def build(log: str, tool_name: str = "refund", variant: str = "") -> MCPServer:
    server = MCPServer("upstream")

    def executed(line: str) -> None:
        with open(log, "a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    def refund(payment_id: str, amount: int) -> str:
        """Refund amount (minor units) on payment_id."""
        executed(f"refund {payment_id} {amount}")
        return f"refunded {amount} on {payment_id}"

    def slow_refund(payment_id: str, amount: int) -> str:
        """Refund, slowly."""
        executed(f"slow_refund {payment_id} {amount}")
        time.sleep(600)
        return "too late"

    def broken(payment_id: str) -> str:
        """Always fails."""
        executed(f"broken {payment_id}")
        raise RuntimeError("the bank is closed")

    def ask(key: str, message: str, field: str, kind: str) -> dict:
        schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
        return {key: ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))}

    def confirmed_refund(payment_id: str, amount: int, ctx: Context) -> str | InputRequiredResult:
        """Refund after the person behind the client confirms it and says why."""
        state, answers = ctx.request_state, ctx.input_responses or {}
        if state is None:
            return InputRequiredResult(input_requests=ask("confirm", f"Refund {amount} on {payment_id}?", "ok",
                                                          "boolean"), request_state=f"asked-confirm:{payment_id}")
        if state == f"asked-confirm:{payment_id}" and "confirm" in answers:
            ok = answers["confirm"].content["ok"]
            return InputRequiredResult(input_requests=ask("reason", "Why?", "reason", "string"),
                                       request_state=f"asked-reason:{payment_id}:{ok}")
        if state.startswith(f"asked-reason:{payment_id}:") and "reason" in answers:
            reason = answers["reason"].content["reason"]
            executed(f"confirmed_refund {payment_id} {amount} {state.rsplit(':', 1)[1]} {reason}")
            return f"refunded {amount} on {payment_id} ({reason})"
        raise ValueError(f"unexpected requestState {state!r}")

    server.tool(name=tool_name, description="Refund, then notify the customer." if variant == "reschemed"
                else None)(refund)
    server.tool()(slow_refund)
    server.tool()(broken)
    if variant == "elicit":
        server.tool()(confirmed_refund)
    if variant == "wide":
        def lookup(payment_id: str) -> str:
            """Look a payment up."""
            executed(f"lookup {payment_id}")
            return f"payment {payment_id}"

        def purge(customer_id: str) -> str:
            """Delete a customer and their payments."""
            executed(f"purge {customer_id}")
            return f"purged {customer_id}"

        server.tool()(lookup)
        server.tool()(purge)
    return server


def traced(app, spans: str):
    """With ``CTRLRUN_TEST_SPANS=FILE``: the SDK's own server spans (it continues ``params._meta.traceparent``)
    exported to FILE as JSON lines, and each request's ``traceparent`` header written there too."""
    import json

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    def write(record: dict) -> None:
        with open(spans, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    class ToFile(SpanExporter):
        def export(self, finished):
            for span in finished:
                write({"span": span.name, "trace_id": f"{span.context.trace_id:032x}",
                       "span_id": f"{span.context.span_id:016x}",
                       "parent_id": f"{span.parent.span_id:016x}" if span.parent else None})
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ToFile()))
    trace.set_tracer_provider(provider)

    async def recording(scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            write({"header": headers.get("traceparent"), "mcp_name": headers.get("mcp-name")})
        await app(scope, receive, send)

    return recording


if __name__ == "__main__":
    port, log = int(sys.argv[1]), sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "refund"
    variant = sys.argv[4] if len(sys.argv) > 4 else ""
    app = build(log, name, variant).streamable_http_app()
    if os.environ.get("CTRLRUN_TEST_SPANS"):
        app = traced(app, os.environ["CTRLRUN_TEST_SPANS"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
