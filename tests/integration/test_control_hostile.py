"""Hostile input at the programmatic entry (``Control.call``): what cannot be an action is refused
with a clear error and nothing recorded; what can is decided and recorded like any call, and the
chain still verifies."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.models import Event, Receipt

pytestmark = pytest.mark.usefixtures("store_db")


def _deep(levels: int) -> dict:
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value  # type: ignore[return-value]


REFUSED = {
    "100k levels deep": ("email.send", {"msg_id": "x", "p": _deep(100_000)}, "mailer"),
    "3 MiB string": ("email.send", {"msg_id": "x", "p": "y" * (3 * 1024 * 1024)}, "mailer"),
    "non-string nested key": ("email.send", {"msg_id": "x", "p": {1: 2}}, "mailer"),
    "bytes": ("email.send", {"msg_id": "x", "p": b"\x00"}, "mailer"),
    "NaN": ("email.send", {"msg_id": "x", "p": float("nan")}, "mailer"),
    "a set": ("email.send", {"msg_id": "x", "p": {1, 2}}, "mailer"),
    "principal an int": ("email.send", {"msg_id": "x"}, 42),
    "principal a dict": ("email.send", {"msg_id": "x"}, {"agent": "x"}),
    "NUL in the principal": ("email.send", {"msg_id": "x"}, "mail\x00er"),
    "a 1 MB action name": ("a" * 1_000_000, {"msg_id": "x"}, "mailer"),
    "a 1 MB principal": ("email.send", {"msg_id": "x"}, "a" * 1_000_000),
}
DECIDED = {
    "bidi in the principal": ("email.send", {"msg_id": "b1"}, "mail\u202eer"),
    "bidi in the action": ("email.send\u202e", {"msg_id": "b2"}, "mailer"),
    "newline in the action": ("email.send\n", {"msg_id": "b3"}, "mailer"),
    "bidi in an argument name": ("email.send", {"msg_id": "b5", "\u202eevil": 1}, "mailer"),
    "bidi in the effect key": ("email.send", {"msg_id": "b6\u202e"}, "mailer"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_be_an_action_is_refused_and_nothing_recorded(case):
    """Refused with InvalidArgument (or ActionDenied) naming the problem; the executor never runs;
    no event or receipt is written."""
    name, arguments, principal = REFUSED[case]
    ran = []
    with pytest.raises((ctrlrun.InvalidArgument, ctrlrun.ActionDenied)) as refused:
        Control().call(name, arguments, lambda: ran.append(1), principal=principal)
    assert str(refused.value) and len(str(refused.value)) < 2000
    assert ran == [] and Event.objects.count() == 0 and Receipt.objects.count() == 0


@pytest.mark.parametrize("case", list(DECIDED))
def test_odd_but_valid_names_are_decided_and_recorded(case):
    """Look-alike and invisible characters are decided by the policy as written (an unlisted name is
    denied), each attempt leaves one receipt, and the chain verifies."""
    name, arguments, principal = DECIDED[case]
    ran = []
    try:
        Control().call(name, arguments, lambda: ran.append(1), principal=principal)
    except ctrlrun.ActionDenied as denied:
        assert denied.reason == "unknown_action" and name != "email.send"
    else:
        assert name == "email.send" and ran == [1]
    assert Receipt.objects.count() == 1
    assert store.verify().ok
