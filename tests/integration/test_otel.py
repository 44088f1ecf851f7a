"""OpenTelemetry (§F4), against the real SDK and its InMemorySpanExporter: one span per action named after
it, the status mapping, ctrlrun.* attributes, event-type span events, arguments only when asked, and the
span current while the function runs (the driver's around_function hook), sync and async."""
from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import ctrlrun
from ctrlrun.control import Control
from ctrlrun.kernel import drive
from ctrlrun.otel import OTelEventSink

pytestmark = pytest.mark.usefixtures("store_db")


@pytest.fixture
def traced():
    """(sink, exporter, tracer): a sink on a provider of its own, exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    made: list[OTelEventSink] = []

    def make(**options):
        sink = OTelEventSink(tracer_provider=provider, **options)
        made.append(sink)
        return sink, exporter, provider.get_tracer("the-app")

    yield make
    for sink in made:
        sink.close()


def refund_control(sink):
    return Control(observers=[sink])


def call_refund(control, payment_id, amount, executor):
    with ctrlrun.context(agent="support-agent", user="alice"):
        return control.call("stripe.refund", {"payment_id": payment_id, "amount": amount}, executor)


def test_the_four_outcomes_each_one_span_named_after_the_action(traced):
    """committed -> OK; a duplicate -> UNSET with EFFECT_RESERVATION_REFUSED; ambiguous -> ERROR; denied -> UNSET."""
    sink, exporter, _ = traced()
    control = refund_control(sink)
    call_refund(control, "txn_1", 100, lambda: "refunded")
    with pytest.raises(ctrlrun.DuplicateEffect):
        call_refund(control, "txn_1", 100, lambda: "again")

    def lost():
        raise TimeoutError("read timed out")

    with pytest.raises(TimeoutError):
        call_refund(control, "txn_2", 100, lost)
    with pytest.raises(ctrlrun.ActionDenied):
        call_refund(control, "txn_3", 5_000_000, lambda: "never")
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["stripe.refund"] * 4
    assert [s.status.status_code for s in spans] == [StatusCode.OK, StatusCode.UNSET, StatusCode.ERROR, StatusCode.UNSET]
    assert spans[2].status.description == "TimeoutError: read timed out"
    assert [s.attributes["ctrlrun.result"] for s in spans] == ["committed", "blocked", "ambiguous", "denied"]
    refused = [e for e in spans[1].events if e.name == "EFFECT_RESERVATION_REFUSED"]
    assert refused and refused[0].attributes["ctrlrun.reason"] == "duplicate"
    assert refused[0].attributes["ctrlrun.state"] == "committed"
    assert sink.open_spans == 0


def test_attributes_and_events_and_no_argument_values_unless_asked(traced):
    sink, exporter, _ = traced()
    call_refund(refund_control(sink), "txn_secret", 100, lambda: "ok")
    [span] = exporter.get_finished_spans()
    attributes = dict(span.attributes)
    for key in ("ctrlrun.action_id", "ctrlrun.action_hash", "ctrlrun.environment", "ctrlrun.decision",
                "ctrlrun.decision_reason", "ctrlrun.receipt_id"):
        assert isinstance(attributes[key], str) and attributes[key]
    assert attributes["ctrlrun.action.name"] == "stripe.refund"
    assert attributes["ctrlrun.principal.agent"] == "support-agent"
    assert attributes["ctrlrun.principal.user"] == "alice"
    assert attributes["ctrlrun.attempt"] == 1 and attributes["ctrlrun.effect_key"] == "refund:txn_secret"
    assert [e.name for e in span.events] == ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED",
                                             "EXECUTION_STARTED", "EXECUTION_COMMITTED"]
    assert span.events[1].attributes["ctrlrun.decision"] == "allow"
    everything = repr(attributes) + repr([dict(e.attributes) for e in span.events])
    assert "txn_secret" not in everything.replace("refund:txn_secret", "")  # only inside the effect key
    assert not any(key.startswith("ctrlrun.argument.") for key in attributes)

    sink2, exporter2, _ = traced(arguments=True)
    call_refund(refund_control(sink2), "txn_shown", 100, lambda: "ok")
    [shown] = exporter2.get_finished_spans()[-1:]
    assert shown.attributes["ctrlrun.argument.payment_id"] == "txn_shown"
    assert shown.attributes["ctrlrun.argument.amount"] == 100


def test_the_span_is_current_while_a_sync_function_runs(traced):
    """A span the function makes is a child of the action's span: live, not rebuilt afterwards."""
    sink, exporter, tracer = traced()

    def executor():
        with tracer.start_as_current_span("stripe.http"):
            return "ok"

    call_refund(refund_control(sink), "txn_4", 100, executor)
    inner, outer = exporter.get_finished_spans()
    assert (inner.name, outer.name) == ("stripe.http", "stripe.refund")
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id
    assert outer.start_time <= inner.start_time and inner.end_time <= outer.end_time
    assert trace.get_current_span() is trace.INVALID_SPAN  # made current for the run only


def test_async_functions_and_sync_functions_from_acall_see_the_span(traced):
    sink, exporter, tracer = traced()
    control = refund_control(sink)

    async def coroutine():
        await asyncio.sleep(0)
        with tracer.start_as_current_span("async.child"):
            return "ok"

    def in_thread():
        with tracer.start_as_current_span("thread.child"):
            return "ok"

    async def main():
        with ctrlrun.context(agent="support-agent"):
            await asyncio.gather(
                control.acall("stripe.refund", {"payment_id": "a1", "amount": 1}, coroutine),
                control.acall("stripe.refund", {"payment_id": "a2", "amount": 2}, in_thread),
            )

    asyncio.run(main())
    drive.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans() if s.name.endswith("child")}
    parents = {s.attributes.get("ctrlrun.effect_key"): s for s in exporter.get_finished_spans()
               if s.name == "stripe.refund"}
    assert spans["async.child"].parent.span_id == parents["refund:a1"].context.span_id
    assert spans["thread.child"].parent.span_id == parents["refund:a2"].context.span_id
    assert all(p.status.status_code is StatusCode.OK for p in parents.values())


def test_a_failing_tracer_never_fails_the_call(traced, caplog):
    """A provider whose spans raise everywhere: logged, and the call returns its value."""
    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError("collector down")

    class Provider:
        def get_tracer(self, *args, **kwargs):
            class Tracer:
                def start_span(self, *a, **k):
                    return Exploding()
            return Tracer()

    sink = OTelEventSink(tracer_provider=Provider())
    try:
        with caplog.at_level(logging.ERROR):
            assert call_refund(refund_control(sink), "txn_5", 100, lambda: "fine") == "fine"
    finally:
        sink.close()
    assert "collector down" in caplog.text


def test_abandoned_spans_are_evicted_not_ended(traced):
    """Calls waiting for a person keep a span open; past max_open_spans the oldest is dropped, never exported."""
    sink, exporter, _ = traced(max_open_spans=2)
    control = refund_control(sink)
    for n in range(3):
        with pytest.raises(ctrlrun.ApprovalRequired):
            call_refund(control, f"big{n}", 200_000, lambda: None)
    assert sink.open_spans == 2
    assert [s.name for s in exporter.get_finished_spans()] == []


def test_an_invalid_max_open_spans_is_a_clear_error():
    with pytest.raises(ctrlrun.InvalidArgument, match="max_open_spans"):
        OTelEventSink(max_open_spans=0)


def test_events_without_an_action_get_a_span_of_their_own(traced):
    """DELEGATION_* events have no action: a span each, named by the type, started and ended at the event."""
    import datetime as dt

    from ctrlrun.values import EventView

    sink, exporter, _ = traced()
    when = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.timezone.utc)
    sink.on_event(EventView(None, when, "DELEGATION_CREATED", None, None, None,
                            {"delegation_id": "dlg_1", "depth": 1, "narrowed": ["actions"]}, seq=7))
    [span] = exporter.get_finished_spans()
    assert span.name == "DELEGATION_CREATED" and span.start_time == span.end_time
    assert dict(span.events[0].attributes) == {"ctrlrun.delegation_id": "dlg_1", "ctrlrun.depth": 1}
    assert sink.open_spans == 0


def test_another_controls_calls_get_no_span(traced):
    """The hook runs for every call of the process; a sink opens spans only for calls it will hear of."""
    sink, exporter, tracer = traced()
    refund_control(sink)  # a Control with the sink, unused

    def executor():
        with tracer.start_as_current_span("elsewhere"):
            return "ok"

    call_refund(Control(), "txn_6", 100, executor)
    [span] = exporter.get_finished_spans()
    assert span.name == "elsewhere" and span.parent is None
    assert sink.open_spans == 0


def test_a_registered_sink_traces_the_default_controls_calls(traced, refund):
    from ctrlrun import observers

    sink, exporter, _ = traced()
    observers.register(sink)
    try:
        with ctrlrun.context(agent="support-agent"):
            refund(payment_id="txn_7", amount=100)
    finally:
        observers.unregister(sink)
    [span] = exporter.get_finished_spans()
    assert span.name == "stripe.refund" and span.status.status_code is StatusCode.OK
