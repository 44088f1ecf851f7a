"""ACS v0.1.0 envelopes for the ACS hook's tests (request-envelope.json's shape), and the policy they run under."""
from __future__ import annotations

import uuid

__all__ = ["ACS_POLICY", "acs_envelope", "tool_call", "tool_result", "acs_result", "acs_error"]

ACS_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  acs.stripe.create_refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000000 }
        decision: approve
      - decision: deny
  acs.stripe.read_balance:
    decision: allow
  acs.stripe.reports_before_acting:
    effect: "report:{payment_id}"
    mcp:
      not_executed_on_error: true
    decision: allow
"""


def acs_envelope(method: str, payload: dict, *, request_id: str | None = None, agent: str = "refund-agent",
                 user: str | None = "alice", rpc_id: object = 1) -> dict:
    metadata: dict = {"agent_id": agent, "session_id": str(uuid.uuid4()), "environment": "production"}
    if user is not None:
        metadata["user_context"] = {"user_id": user, "roles": ["support"]}
    return {"jsonrpc": "2.0", "method": method, "id": rpc_id,
            "params": {"acs_version": "0.1.0", "request_id": request_id or str(uuid.uuid4()),
                       "timestamp": "2026-12-04T10:00:00Z", "metadata": metadata, "payload": payload}}


def tool_call(tool: str = "create_refund", *, provider: str = "stripe", request_id: str | None = None,
              operation: str | None = None, agent: str = "refund-agent", user: str | None = "alice",
              **arguments: object) -> dict:
    if tool in ("create_refund", "reports_before_acting"):
        arguments = {"payment_id": "txn_1", "amount": 200, **arguments}
    payload: dict = {"tool": {"name": tool, "provider": provider},
                     "arguments": {name: {"value": value, "provenance": {"source": "user"}}
                                   for name, value in arguments.items()}}
    if operation is not None:
        payload["operation"] = operation
    return acs_envelope("steps/toolCallRequest", payload, request_id=request_id, agent=agent, user=user)


def tool_result(request_id: str | None, exit_status: str = "success", *, tool: str = "create_refund",
                provider: str | None = "stripe") -> dict:
    payload: dict = {"tool": {"name": tool}, "exit_status": exit_status,
                     "outputs": [{"value": {"id": "re_1"}, "provenance": {"source": "tool"}}]}
    if provider is not None:
        payload["tool"]["provider"] = provider
    if request_id is not None:
        payload["request_id_ref"] = request_id
    return acs_envelope("steps/toolCallResult", payload)


def acs_result(answer: dict) -> dict:
    """The ``result`` of a response envelope (asserting it is one, and that it survives JSON)."""
    import json

    assert json.loads(json.dumps(answer)) == answer
    assert answer["jsonrpc"] == "2.0" and "error" not in answer, answer
    result = answer["result"]
    assert result["type"] == "final" and result["acs_version"] == "0.1.0"
    return result


def acs_error(answer: dict) -> dict:
    import json

    assert json.loads(json.dumps(answer)) == answer
    assert answer["jsonrpc"] == "2.0" and "result" not in answer, answer
    return answer["error"]
