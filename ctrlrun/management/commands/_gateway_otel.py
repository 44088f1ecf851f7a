"""``--otel`` and ``--otel-arguments`` of the gateway (§E1, §F4): a span per ``tools/call``, exported as
the standard ``OTEL_*`` variables say (``ctrlrun.gateway.tracing.environment_provider``).

``add_otel_arguments(parser)`` declares the flags; ``otel_from(options)`` gives the tracer provider
(None without ``--otel``) and the banner's lines, or refuses with exit 2: ``--otel-arguments``
without ``--otel``, or ``--otel`` without OpenTelemetry's SDK or the exporter asked for.
``otel_stop(provider)`` exports what is still batched (also done on SIGTERM).
"""
from __future__ import annotations

import signal
from argparse import ArgumentParser
from typing import Any

from ..base import Error

__all__ = ["add_otel_arguments", "otel_from", "otel_stop"]

_stopped: set[int] = set()


def add_otel_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--otel", action="store_true",
                        help="an OpenTelemetry span per tools/call, exported as the OTEL_* variables say "
                             "(needs the otel extra and an exporter)")
    parser.add_argument("--otel-arguments", action="store_true",
                        help="with --otel: put the calls' argument values on the spans (off by default)")


def otel_from(options: dict[str, Any]) -> tuple[Any, list[str]]:
    if options.get("otel_arguments") and not options.get("otel"):
        raise Error("--otel-arguments goes with --otel: argument values are only sent on the gateway's spans",
                    returncode=2)
    if not options.get("otel"):
        return None, []
    from ...otel import MissingDependency

    try:
        from ctrlrun.gateway.tracing import environment_provider

        provider, lines = environment_provider()
    except MissingDependency as exc:
        raise Error(str(exc), returncode=2) from None
    from opentelemetry import trace

    trace.set_tracer_provider(provider)  # the process's: other instrumentation here exports alike
    previous = signal.getsignal(signal.SIGTERM)

    def terminated(number: int, frame: Any) -> None:  # uvicorn raises SIGTERM again once it has stopped
        otel_stop(provider)
        signal.signal(number, previous)
        signal.raise_signal(number)

    signal.signal(signal.SIGTERM, terminated)
    shown = "with argument values (--otel-arguments)" if options.get("otel_arguments") else "without argument values"
    return provider, [f"{lines[0]}, {shown}"]


def otel_stop(provider: Any) -> None:
    """Export the spans still batched, once (on the way out: the command's end, or SIGTERM)."""
    if provider is not None and id(provider) not in _stopped:
        _stopped.add(id(provider))
        provider.shutdown()
