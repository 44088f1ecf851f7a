"""Hostile and look-alike arguments through ``ctrlrun.protect`` on a real database.

A str/int subclass must reach the same effect key as its plain value (one real-world effect), and
an argument that cannot be canonicalised must be InvalidArgument before anything is written or run.
"""
from __future__ import annotations

import enum

import pytest

import ctrlrun
from ctrlrun.canonical import MAX_ARGUMENTS_SIZE
from ctrlrun.models import Approval, EffectRecord, Event, Receipt
from tests.support import receipts

pytestmark = pytest.mark.usefixtures("store_db")


class Color(str, enum.Enum):
    RED = "red"


class Tagged(str):
    """A str subclass that is a different dict key from its own text (its own __eq__ and __hash__)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is Tagged and str.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(("tagged", str.__str__(self)))


class Tier(enum.IntEnum):
    GOLD = 3


class Sneaky(int):
    """An int subclass whose text forms lie."""

    def __str__(self) -> str:
        return "LIES"

    def __repr__(self) -> str:
        return "LIES"

    def __format__(self, spec: str) -> str:
        return "LIES"


def _looped_dict() -> dict:
    looped: dict = {"a": 1}
    looped["self"] = looped
    return looped


def _looped_list() -> list:
    looped: list = [1]
    looped.append(looped)
    return looped


def _deep(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def _nothing_recorded() -> bool:
    return not (Event.objects.exists() or Receipt.objects.exists() or EffectRecord.objects.exists()
                or Approval.objects.exists())


@pytest.fixture
def send():
    """email.send (allowed by the policy) keyed by msg_id, with a free-form body; records what it received."""
    received: list[tuple[object, object]] = []

    @ctrlrun.protect("email.send", effect="email:{msg_id}", resource="inbox:{msg_id}")
    def send(msg_id: object, body: object = None) -> str:
        received.append((msg_id, body))
        return "sent"

    send.received = received  # type: ignore[attr-defined]
    return send


@pytest.mark.parametrize("first, second", [(Color.RED, "red"), ("red", Color.RED)], ids=["enum-first", "str-first"])
def test_enum_member_and_its_value_hit_one_effect_key(refund, remote, agent, first, second):
    """payment_id=Color.RED then "red" (either order) is one effect: the second is DuplicateEffect(committed)."""
    refund(payment_id=first, amount=100)
    with pytest.raises(ctrlrun.DuplicateEffect) as caught:
        refund(payment_id=second, amount=100)
    assert caught.value.state == "committed"
    assert remote.calls == [("red", 100)] and type(remote.calls[0][0]) is str
    assert list(EffectRecord.objects.values_list("effect_key", flat=True)) == ["refund:red"]
    first_receipt, second_receipt = receipts()
    assert (first_receipt["result"], second_receipt["result"]) == ("committed", "blocked")
    assert first_receipt["action_hash"] == second_receipt["action_hash"]
    assert first_receipt["arguments"] == {"amount": 100, "payment_id": "red"}


@pytest.mark.parametrize("first, second", [(Tier.GOLD, 3), (Sneaky(3), 3)], ids=["IntEnum", "int-overridden-str"])
def test_int_subclass_and_its_value_hit_one_effect_and_resource_key(send, agent, first, second):
    """An int subclass renders its integer value in the effect key and the resource, and the body gets an exact int."""
    assert send(msg_id=first, body={"tier": first}) == "sent"
    with pytest.raises(ctrlrun.DuplicateEffect):
        send(msg_id=second, body={"tier": second})
    assert send.received == [(3, {"tier": 3})]
    msg_id, body = send.received[0]
    assert type(msg_id) is int and type(body["tier"]) is int
    assert list(EffectRecord.objects.values_list("effect_key", flat=True)) == ["email:3"]
    assert [(r["effect_key"], r["resource"]) for r in receipts()] == [("email:3", "inbox:3")] * 2


def test_str_enum_renders_its_value_in_the_resource(send, agent):
    """The resource template renders Color.RED as "red", like the effect key and the action hash."""
    send(msg_id=Color.RED)
    [doc] = receipts()
    assert (doc["effect_key"], doc["resource"], doc["arguments"]) == ("email:red", "inbox:red",
                                                                      {"body": None, "msg_id": "red"})


HOSTILE = [
    pytest.param({"body": {"a\ud800": 1}}, "lone surrogate", id="surrogate-in-key"),
    pytest.param({"body": ["ok", "b\udcff"]}, "lone surrogate", id="surrogate-in-value"),
    pytest.param({"body": _deep(5000)}, "deeper than 64", id="5000-deep"),
    pytest.param({"body": _looped_dict()}, "refers to itself", id="self-dict"),
    pytest.param({"body": _looped_list()}, "refers to itself", id="self-list"),
    pytest.param({"body": 10**4999}, "more than 640 digits", id="huge-int"),
    pytest.param({"body": "x" * (MAX_ARGUMENTS_SIZE + 1)}, "larger than", id="oversized"),
    pytest.param({"body": {Tagged("red"): 1, "red": 2}}, "both become 'red'", id="colliding-keys"),
    pytest.param({"body": 1.5}, "float", id="float"),
]


@pytest.mark.parametrize("arguments, message", HOSTILE)
def test_hostile_argument_is_refused_with_nothing_recorded(send, agent, arguments, message):
    """Each hostile argument is InvalidArgument naming arguments.body; nothing is written and nothing runs."""
    with pytest.raises(ctrlrun.InvalidArgument, match=message) as caught:
        send(msg_id="m1", **arguments)
    assert "arguments.body" in str(caught.value)
    str(caught.value).encode("utf-8")  # the message itself is printable text
    assert send.received == []
    assert _nothing_recorded()


@pytest.mark.parametrize("msg_id, message", [
    pytest.param("m\ud800", "lone surrogate", id="surrogate"),
    pytest.param(10**4999, "digits", id="huge-int"),
])
def test_hostile_value_in_a_rendered_key_is_refused_with_nothing_recorded(send, agent, msg_id, message):
    """A placeholder value that cannot become a stored key is InvalidArgument, nothing recorded, nothing run."""
    with pytest.raises(ctrlrun.InvalidArgument, match=message):
        send(msg_id=msg_id)
    assert send.received == []
    assert _nothing_recorded()


def test_nul_inside_an_argument_value_is_stored_escaped(send, agent):
    """A NUL inside a value (not in a key the store indexes) is kept: JSON writes it as \\u0000 on every database."""
    assert send(msg_id="m1", body={"k\x00": "a\x00b"}) == "sent"
    assert send.received == [("m1", {"k\x00": "a\x00b"})]
    [doc] = receipts()
    assert doc["arguments"]["body"] == {"k\x00": "a\x00b"}
    assert "\\u0000" in Receipt.objects.get().document


def test_nul_in_a_rendered_resource_is_refused_with_nothing_recorded(send, agent):
    """A NUL that would reach the rendered resource is InvalidArgument before anything is written."""
    with pytest.raises(ctrlrun.InvalidArgument, match="NUL"):
        send(msg_id="m\x00")
    assert send.received == []
    assert _nothing_recorded()


def test_nul_in_a_rendered_effect_key_is_a_recorded_effect_key_error(refund, remote, agent):
    """A NUL that would reach the effect key is EffectKeyError, recorded as a denial; the remote is not called."""
    with pytest.raises(ctrlrun.EffectKeyError, match="NUL"):
        refund(payment_id="t\x00", amount=1)
    assert remote.calls == [] and not EffectRecord.objects.exists()
    assert [(r["result"], r["decision_reason"]) for r in receipts()] == [("denied", "effect_key_error")]


@pytest.mark.parametrize(("agent_name", "message"), [
    ("a" * 201, "at most 200"), ("a\x00b", "NUL"), ("a\udcff", "lone surrogate"),
])
def test_names_the_store_cannot_hold_are_refused_before_anything_runs(refund, remote, agent_name, message):
    """An agent name too long, or with NUL or a lone surrogate, is InvalidArgument on every database."""
    with pytest.raises(ctrlrun.InvalidArgument, match=message):
        with ctrlrun.context(agent=agent_name):
            refund(payment_id="txn_1", amount=100)
    assert remote.calls == [] and not Receipt.objects.exists()
