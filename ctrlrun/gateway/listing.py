"""``--hide-denied-tools``: the upstream's ``tools/list`` answer without the tools the policy denies
outright (``Policy.denies_outright``: unlisted, a bare ``decision: deny``, or rules that all deny).

The list is a courtesy to the agent, not the enforcement: a hidden tool called anyway is refused by
the policy exactly as before. A tool whose verdict depends on its arguments or on who calls is
always listed. The answer keeps everything else the upstream said (``nextCursor``, other result
keys, the other messages and event ids of a Server-Sent-Events body); one that is not a readable
``tools/list`` result is relayed unchanged (the caller logs a warning).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ctrlrun.gateway.wire import dumps

__all__ = ["Malformed", "without_hidden"]


class Malformed(Exception):
    """The upstream's answer is not a ``tools/list`` result the gateway can read: relay it unchanged."""


def _filtered(message: Any, request_id: Any, hidden: Callable[[str], bool]) -> tuple[dict[str, Any], list[str]] | None:
    """``message`` without the hidden tools, and their names; None when it is not this request's answer."""
    if not isinstance(message, dict) or message.get("id") != request_id or not (
            "result" in message or "error" in message):
        return None
    if "error" in message:
        return message, []
    result = message["result"]
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        raise Malformed("its result has no list of tools")
    kept, dropped = [], []
    for tool in result["tools"]:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise Malformed("a tool in its list has no name")
        (dropped if hidden(tool["name"]) else kept).append(tool)
    return {**message, "result": {**result, "tools": kept}}, [tool["name"] for tool in dropped]


def _sse(text: str, request_id: Any, hidden: Callable[[str], bool]) -> tuple[str, list[str]]:
    """An SSE body with this request's answer rewritten in place; every other line kept."""
    events: list[list[str]] = [[]]
    for line in text.splitlines():
        if line:
            events[-1].append(line)
        elif events[-1]:
            events.append([])
    out, names, found = [], [], False
    for lines in events:
        if not lines:
            continue
        data = [line[6:] if line.startswith("data: ") else line[5:] for line in lines if line.startswith("data:")]
        answer = None
        if data and not found:
            try:
                answer = _filtered(json.loads("\n".join(data)), request_id, hidden)
            except (ValueError, RecursionError):
                answer = None
        if answer is None:
            out.append("\n".join(lines))
            continue
        found = True
        message, names = answer
        first = next(i for i, line in enumerate(lines) if line.startswith("data:"))
        rest = [line for i, line in enumerate(lines) if i < first or not line.startswith("data:")]
        rest.insert(first, "data: " + dumps(message).decode("utf-8"))
        out.append("\n".join(rest))
    if not found:
        raise Malformed("no event carries the answer to this request")
    return "".join(event + "\n\n" for event in out), names


def without_hidden(raw: bytes, content_type: str, request_id: Any,
                   hidden: Callable[[str], bool]) -> tuple[bytes, list[str]]:
    """The answer's bytes without the hidden tools, and the names left out; ``Malformed`` when the
    answer cannot be read as this request's ``tools/list`` answer."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("it is not UTF-8") from None
    if content_type == "text/event-stream":
        body, names = _sse(text, request_id, hidden)
        return body.encode("utf-8"), names
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        raise Malformed("it is not JSON") from None
    answer = _filtered(message, request_id, hidden)
    if answer is None:
        raise Malformed("it is not the answer to this request")
    filtered, names = answer
    return (raw if not names else dumps(filtered)), names
