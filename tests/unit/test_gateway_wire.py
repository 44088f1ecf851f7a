"""The gateway's pure parts: the outcome table (§E2) row by row, and the wire checks (§E1)."""
from __future__ import annotations

import pytest

from ctrlrun.gateway.outcome import Observed, classify
from ctrlrun.gateway.wire import ERRORS, GatewayError, check_mirror_headers, depth_exceeds, find_unrepresentable


def answer(result=None, error=None, status=200, revision="2026-07-28", headers=None):
    message = {"jsonrpc": "2.0", "id": 1, **({"error": error} if error else {"result": result})}
    return Observed(None, status=status, headers=headers or {}, message=message, revision=revision)


@pytest.mark.parametrize("observed, flag, result, synthesized", [
    (Observed("never_connected", "refused"), False, "failed", "upstream_not_executed"),
    (Observed("unpinned", "not a pinned certificate"), False, "failed", "upstream_unpinned"),
    (Observed("lost", "reset"), False, "ambiguous", "upstream_ambiguous"),
    (Observed("client_disconnected"), False, "ambiguous", None),
    (answer({"resultType": "complete", "content": []}), False, "committed", None),
    (answer({"resultType": "complete", "isError": True}), False, "ambiguous", None),
    (answer({"resultType": "complete", "isError": True}), True, "failed", None),
    (answer({"content": []}), False, "ambiguous", None),  # current revision: no resultType, unknown
    (answer({"content": []}, revision="2025-06-18"), False, "committed", None),  # legacy: complete
    (answer({"resultType": "something_new"}), False, "ambiguous", None),
    (answer({"resultType": "input_required"}), False, "ambiguous", "upstream_ambiguous"),
    (answer(error={"code": -32602, "message": "x"}), False, "failed", None),
    (answer(error={"code": -32601, "message": "x"}), False, "failed", None),
    (answer(error={"code": -32603, "message": "x"}), False, "ambiguous", None),
    (answer(error={"code": -1, "message": "x"}), False, "ambiguous", None),
    (answer(error={"code": -1, "message": "x"}, status=401), False, "failed", None),
    (answer(error={"code": -1, "message": "x"}, status=403, headers={"WWW-Authenticate": "Bearer"}), False,
     "failed", None),
    (answer(error={"code": -1, "message": "x"}, status=403), False, "ambiguous", "upstream_ambiguous"),
    (answer({"resultType": "complete"}, status=500), False, "ambiguous", "upstream_ambiguous"),
    (Observed(None, status=200, message=None), False, "ambiguous", "upstream_ambiguous"),
])
def test_the_outcome_table(observed, flag, result, synthesized):
    outcome = classify(observed, not_executed_on_error=flag)
    assert (outcome.result, outcome.synthesized) == (result, synthesized)


def test_input_required_with_a_request_state_is_a_suspension():
    outcome = classify(answer({"resultType": "input_required", "requestState": "st-1"}))
    assert outcome.request_state == "st-1" and outcome.result == "ambiguous"


def test_the_error_table_is_the_frozen_interface():
    assert [ERRORS[n][0] for n in ERRORS] == list(range(-41001, -41017, -1))
    assert all(token.startswith("ctrlrun.") for _, token, _ in ERRORS.values())
    body = GatewayError.of("duplicate_effect", "dup", 7, effect_key="k", state="committed").body()
    assert body == {"jsonrpc": "2.0", "id": 7, "error": {"code": -41004, "message": "dup", "data": {
        "error": "ctrlrun.duplicate_effect", "effect_key": "k", "state": "committed"}}}


def test_floats_are_found_by_pointer_and_depth_is_counted_outside_strings():
    assert find_unrepresentable({"amount": 1.5}) == "/amount"
    assert find_unrepresentable({"a/b": [1, {"c": 2.0}]}) == "/a~1b/1/c"
    assert find_unrepresentable({"amount": 1, "ok": True, "s": "1.5"}) is None
    assert depth_exceeds(b"[" * 65 + b"]" * 65) and not depth_exceeds(b"[" * 64 + b"]" * 64)
    assert not depth_exceeds(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\""}')


def test_mirror_headers_must_agree_with_the_body():
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {"n": 3}}}
    check_mirror_headers({"mcp-method": "tools/call", "mcp-name": "t", "mcp-param-n": "3"}, message, "2026-07-28")
    check_mirror_headers({}, message, "2025-06-18")  # optional on a legacy revision
    for headers, revision in (({}, "2026-07-28"), ({"mcp-method": "tools/call"}, "2026-07-28"),
                              ({"mcp-name": "other"}, "2025-06-18"), ({"mcp-param-n": "4"}, "2025-06-18")):
        with pytest.raises(GatewayError) as refused:
            check_mirror_headers(headers, message, revision)
        assert refused.value.code == -32020


def test_the_upstream_tls_contexts_are_made_once_not_per_exchange():
    # An httpx client left to make its own context loads certifi's bundle each time; the gateway
    # makes a client per exchange (a fresh connection per call), so it hands them one made once.
    from ctrlrun.gateway import upstream

    assert upstream._verify(None) is upstream._verify({"tool_schema_sha256": "sha256:" + "0" * 64})
    assert upstream.relay_verify([]) is upstream._verify(None)
