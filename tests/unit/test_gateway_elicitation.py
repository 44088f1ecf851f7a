"""The gateway's elicitation parts that need no network (§E2): the continuation token it issues and
reads back, and what an executor does with each answer on a first leg and on a continuation leg."""
from __future__ import annotations

import base64

import pytest

from ctrlrun.gateway.elicitation import PREFIX, Asked, Leg, issue, read, settle
from ctrlrun.gateway.outcome import Observed, classify


def answer(result=None, error=None, status=200):
    message = {"jsonrpc": "2.0", "id": 1, **({"error": error} if error else {"result": result})}
    return classify(Observed(None, status=status, message=message))


ASKS = {"resultType": "input_required", "requestState": "up-1", "inputRequests": {}}


def test_a_token_carries_its_binding_and_two_tokens_never_match():
    one, two = issue("sha256:abc", 1, "up-1"), issue("sha256:abc", 1, "up-1")
    assert one != two and one.startswith(PREFIX)
    bound = read(one)
    assert (bound.action_hash, bound.round, bound.state) == ("sha256:abc", 1, "up-1")


@pytest.mark.parametrize("token", [
    None, 17, "", "up-1", PREFIX, PREFIX + "nonce", PREFIX + "nonce.", PREFIX + ".payload", PREFIX + "n.!!!",
    PREFIX + "n." + base64.urlsafe_b64encode(b"[1, 2]").decode(),
    PREFIX + "n." + base64.urlsafe_b64encode(b'{"h": "x", "r": 0, "s": "up"}').decode(),
    PREFIX + "n." + base64.urlsafe_b64encode(b'{"h": "x", "r": true, "s": "up"}').decode(),
    PREFIX + "n." + base64.urlsafe_b64encode(b'{"h": "x", "r": 1, "s": ""}').decode(),
    PREFIX + "n." + base64.urlsafe_b64encode(b'{"h": "x", "r": 1, "s": "up", "extra": 1}').decode(),
    PREFIX + "n." + base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    PREFIX + "n." + base64.urlsafe_b64encode(b"[" * 5000).decode(),
])
def test_anything_the_gateway_did_not_issue_reads_as_none(token):
    assert read(token) is None


def test_a_first_leg_suspends_and_a_continuation_leg_asks_again_with_the_next_round():
    with pytest.raises(Asked) as first:
        settle(answer(ASKS), Leg("sha256:abc", "k", 0))
    assert read(first.value.continuation).round == 1 and read(first.value.continuation).state == "up-1"
    with pytest.raises(Asked) as again:
        settle(answer(ASKS), Leg("sha256:abc", "k", 3))
    assert read(again.value.continuation).round == 4


def test_the_round_past_the_bound_and_an_unkeyed_call_are_ambiguous():
    past = settle(answer(ASKS), Leg("h", "k", 8, 8))
    assert (past.result, past.synthesized, past.reason) == ("ambiguous", "upstream_ambiguous", "max_elicitation_rounds")
    assert "9th" in past.error
    unkeyed = settle(answer(ASKS), Leg("h", None, 0))
    assert (unkeyed.result, unkeyed.reason) == ("ambiguous", "unkeyed_elicitation")


@pytest.mark.parametrize("outcome", [
    classify(Observed("never_connected", "refused")),
    answer(error={"code": -32602, "message": "bad"}),
    answer(error={"code": -1, "message": "who?"}, status=401),
])
def test_what_is_failed_on_a_first_leg_is_ambiguous_on_a_continuation_leg(outcome):
    assert settle(outcome, Leg("h", "k", 0)).result == "failed"
    continued = settle(outcome, Leg("h", "k", 1))
    assert continued.result == "ambiguous" and "continuation leg" in continued.error
    if outcome.synthesized:  # never connected: not -41011 (which says nothing ran) but -41010
        assert continued.synthesized == "upstream_ambiguous"


def test_a_complete_answer_is_committed_on_either_leg():
    done = answer({"resultType": "complete", "content": []})
    assert settle(done, Leg("h", "k", 0)).result == settle(done, Leg("h", "k", 2)).result == "committed"
