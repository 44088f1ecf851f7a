"""OpenTelemetry: one span per action (spec §F4), through the app's tracer provider.

``OTelEventSink(*, tracer_provider=None, arguments=False, max_open_spans=1024)`` is a sink
(``ctrlrun.sinks``): give it to ``Control(observers=[...])`` or ``ctrlrun.observers.register``. It
needs ``opentelemetry-api`` (``pip install 'django-ctrlrun[otel]'``), imported when a sink is made;
without it the sink's constructor raises ``MissingDependency`` saying what to install.

- A call whose function runs: its span opens, live, as the function is about to run (the driver's
  ``around_function`` hook, sync and async), named ``ctrlrun.action`` and at once renamed to the
  action's name, and is the **current span** while the function runs, so spans the function makes
  (an HTTP client's, a database's) are its children. Its opening events commit with its outcome
  (the store keeps them on the effect record meanwhile), so they are added when they arrive, with
  their own times, and the receipt ends the span (at its ``finished_at``).
- A call refused or sent for approval runs nothing: its span opens on its committed
  ``ACTION_PROPOSED`` (at the event's time) and ends on its receipt.
- Each event is a span event named by its type, with ``ctrlrun.<data key>`` for each primitive
  value (others are dropped), ``ctrlrun.effect_key`` and ``ctrlrun.approval_id``.
- The receipt sets ``ctrlrun.action_id``, ``ctrlrun.action.name``, ``ctrlrun.action_hash``,
  ``ctrlrun.principal.agent``, ``ctrlrun.environment``, ``ctrlrun.decision``,
  ``ctrlrun.decision_reason``, ``ctrlrun.attempt``, ``ctrlrun.result``, ``ctrlrun.receipt_id``; when
  present ``ctrlrun.principal.user``, ``ctrlrun.principal.issuer``, ``ctrlrun.principal.claims``
  (the claim *names*, comma-joined), ``ctrlrun.resource``, ``ctrlrun.effect_key``,
  ``ctrlrun.approval_id``, ``ctrlrun.approver``; with ``arguments=True``,
  ``ctrlrun.argument.<name>`` for each primitive argument value.
- Status: ``ERROR`` for ``failed`` and ``ambiguous`` (the description is the receipt's error),
  ``OK`` for ``committed``, left ``UNSET`` for ``denied`` and ``blocked`` (a refusal is not an error)
  and for ``observed`` (observe mode).
- Events with no action (``DELEGATION_*``) get a span of their own, named by the event type; so does
  a receipt (or an event) whose action's span is not open (the sink was added later, or it was evicted).
- At most ``max_open_spans`` spans are open: past that the oldest (an approval nobody answered) is
  dropped - never ended, so never exported half-told.

Nothing here raises into the call: a failure is logged on ``ctrlrun.otel`` by the observers.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import weakref
from collections import OrderedDict
from contextlib import nullcontext
from typing import Any

from . import observers
from .errors import CTRLRunError

logger = logging.getLogger("ctrlrun.otel")

__all__ = ["OTelEventSink", "MissingDependency", "SPAN_NAME", "INSTRUMENTATION_NAME", "receipt_attributes"]


class MissingDependency(CTRLRunError, ImportError):
    """An optional package this feature needs is not installed; the message says what to install."""

#: The name a span opens with, before it is renamed to the action's name.
SPAN_NAME = "ctrlrun.action"
INSTRUMENTATION_NAME = "ctrlrun"
_PRIMITIVE = (str, bool, int, float)
_ERROR_RESULTS = frozenset({"failed", "ambiguous"})


def _api() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        raise MissingDependency("ctrlrun.otel needs opentelemetry-api: pip install 'django-ctrlrun[otel]'") from None
    return trace


def _nanos(moment: Any) -> int | None:
    """Epoch nanoseconds of a datetime or an evidence timestamp (``2026-11-29T17:21:57.420Z``)."""
    if isinstance(moment, str):
        try:
            moment = dt.datetime.fromisoformat(moment.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(moment, dt.datetime):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _action_name(event: Any) -> str | None:
    action = (event.data or {}).get("action")
    if isinstance(action, dict) and isinstance(action.get("name"), str):
        return action["name"]
    return None


def _event_attributes(event: Any) -> dict[str, Any]:
    attributes = {f"ctrlrun.{key}": value for key, value in (event.data or {}).items()
                  if isinstance(value, _PRIMITIVE)}
    if event.effect_key is not None:
        attributes["ctrlrun.effect_key"] = event.effect_key
    if event.approval_id is not None:
        attributes["ctrlrun.approval_id"] = event.approval_id
    return attributes


def receipt_attributes(receipt: dict[str, Any], *, arguments: bool = False) -> dict[str, Any]:
    """The span attributes a receipt gives (``arguments``: its primitive argument values too)."""
    principal = receipt.get("principal") or {}
    attributes: dict[str, Any] = {
        "ctrlrun.action_id": receipt.get("action_id"),
        "ctrlrun.action.name": receipt.get("action"),
        "ctrlrun.action_hash": receipt.get("action_hash"),
        "ctrlrun.principal.agent": principal.get("agent"),
        "ctrlrun.environment": receipt.get("environment"),
        "ctrlrun.decision": receipt.get("decision"),
        "ctrlrun.decision_reason": receipt.get("decision_reason"),
        "ctrlrun.attempt": receipt.get("attempt"),
        "ctrlrun.result": receipt.get("result"),
        "ctrlrun.receipt_id": receipt.get("receipt_id"),
    }
    optional = {
        "ctrlrun.principal.user": principal.get("user"),
        "ctrlrun.principal.issuer": principal.get("issuer"),
        "ctrlrun.principal.claims": ",".join(sorted(principal["claims"])) if principal.get("claims") else None,
        "ctrlrun.resource": receipt.get("resource"),
        "ctrlrun.effect_key": receipt.get("effect_key"),
        "ctrlrun.approval_id": receipt.get("approval_id"),
        "ctrlrun.approver": receipt.get("approver"),
    }
    attributes.update(optional)
    if arguments and isinstance(receipt.get("arguments"), dict):
        for name, value in receipt["arguments"].items():
            attributes[f"ctrlrun.argument.{name}"] = value
    return {key: value for key, value in attributes.items() if isinstance(value, _PRIMITIVE)}


class OTelEventSink:
    """A sink that turns each action's events and receipt into one OpenTelemetry span."""

    def __init__(self, *, tracer_provider: Any = None, arguments: bool = False, max_open_spans: int = 1024) -> None:
        trace = _api()
        from .errors import InvalidArgument

        if isinstance(max_open_spans, bool) or not isinstance(max_open_spans, int) or max_open_spans < 1:
            raise InvalidArgument(f"OTelEventSink(max_open_spans={max_open_spans!r}): must be a whole number, 1 or more")
        self._trace = trace
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        from . import __version__

        self._tracer = provider.get_tracer(INSTRUMENTATION_NAME, __version__)
        self.arguments = bool(arguments)
        self.max_open_spans = max_open_spans
        self._spans: OrderedDict[str, Any] = OrderedDict()
        self._live: dict[str, bool] = {}  # action ids whose span opened as their function started
        self._lock = threading.Lock()
        from .kernel import drive

        reference = weakref.ref(self)

        def around(action: Any) -> Any:  # holds the sink weakly: a dropped sink stops hooking calls
            sink = reference()
            return nullcontext() if sink is None else sink._current(action)

        self._around = around
        drive.around_function(around)

    @property
    def open_spans(self) -> int:
        """How many actions' spans are open (proposed, no receipt yet)."""
        with self._lock:
            return len(self._spans)

    def close(self) -> None:
        """Stop making the function's run current in its span (the driver's hook is removed)."""
        from .kernel import drive

        drive.remove_around_function(self._around)

    # ------------------------------------------------------------------- the sink's two methods

    def on_event(self, event: Any) -> None:
        if event.action_id is None:
            self._standalone(event)
            return
        if event.type == "ACTION_PROPOSED":
            self._open(event)
            return
        with self._lock:
            span = self._spans.get(event.action_id)
        if span is None:
            self._standalone(event)
            return
        span.add_event(event.type, _event_attributes(event), timestamp=_nanos(event.ts))

    def on_receipt(self, receipt: dict[str, Any]) -> None:
        with self._lock:
            span = self._spans.pop(receipt.get("action_id"), None)
            live = self._live.pop(receipt.get("action_id"), False)
        if span is None:  # its ACTION_PROPOSED was not heard: a span for the receipt alone
            span = self._new_span(_nanos(receipt.get("started_at")))
        if isinstance(receipt.get("action"), str):
            span.update_name(receipt["action"])
        span.set_attributes(receipt_attributes(receipt, arguments=self.arguments))
        result = receipt.get("result")
        status = self._trace.Status
        if result in _ERROR_RESULTS:
            error = receipt.get("error")
            span.set_status(status(self._trace.StatusCode.ERROR, error if isinstance(error, str) else result))
        elif result == "committed":
            span.set_status(status(self._trace.StatusCode.OK))
        # A span opened live ends now, on the host's clock it started on; one opened from the evidence
        # ends at the receipt's finished_at, on the store's clock its start came from.
        self._end(span, receipt, None if live else _nanos(receipt.get("finished_at")))

    # ------------------------------------------------------------------- helpers

    def _open(self, event: Any) -> None:
        with self._lock:
            span = self._spans.get(event.action_id)
        if span is None:  # a call refused or sent for approval: its events commit before any run
            span = self._start(event.action_id, _action_name(event), _nanos(event.ts))
        span.add_event(event.type, _event_attributes(event), timestamp=_nanos(event.ts))

    def _new_span(self, start_time: int | None) -> Any:
        """A new action span (a subclass adds a kind and attributes: the gateway's, ctrlrun.gateway.tracing)."""
        return self._tracer.start_span(SPAN_NAME, start_time=start_time)

    def _end(self, span: Any, receipt: dict[str, Any], end_time: int | None) -> None:
        """End an action's span once its receipt is told (a subclass may end it a moment later)."""
        span.end(end_time=end_time)

    def _start(self, action_id: str, name: str | None, start_time: int | None) -> Any:
        span = self._new_span(start_time)
        if name is not None:
            span.update_name(name)
        span.set_attribute("ctrlrun.action_id", action_id)
        with self._lock:
            self._spans[action_id] = span
            while len(self._spans) > self.max_open_spans:
                evicted, _ = self._spans.popitem(last=False)  # dropped, not ended: never exported half-told
                self._live.pop(evicted, None)
        return span

    def _standalone(self, event: Any) -> None:
        when = _nanos(event.ts)
        span = self._tracer.start_span(event.type, start_time=when)
        if event.action_id is not None:
            span.set_attribute("ctrlrun.action_id", event.action_id)
        span.add_event(event.type, _event_attributes(event), timestamp=when)
        span.end(end_time=when)

    def _current(self, action: Any) -> Any:
        """The driver's hook, as the function is about to run: the action's span (opened now, live,
        unless its events were already heard) made current for the run."""
        action_id = getattr(action, "action_id", None)
        if not isinstance(action_id, str) or self not in (observers.wanted() or ()):
            return nullcontext()  # another Control's call: this sink will never hear its receipt
        with self._lock:
            span = self._spans.get(action_id)
        if span is None:
            name = getattr(action, "name", None)
            span = self._start(action_id, name if isinstance(name, str) else None, None)
            with self._lock:
                if action_id in self._spans:
                    self._live[action_id] = True
        return self._trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)

    def __repr__(self) -> str:
        return f"OTelEventSink(arguments={self.arguments}, max_open_spans={self.max_open_spans})"
