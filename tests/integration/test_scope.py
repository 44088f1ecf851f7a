"""A scope provider (``protect(scope=...)``, §C6): the resources this one call may touch, asked right
before its key is taken; both drivers, the real store."""
from __future__ import annotations

import asyncio
import threading

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.models import Approval, EffectRecord, Event
from ctrlrun.policy import parse_policy
from tests.support import receipts

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  records.update:
    effect: "update:{record_id}"
    resource: "record:{owner}:{record_id}"
    rules:
      - when: {size_lte: 10}
        decision: allow
      - decision: approve
  notes.write:
    effect: "note:{text}"
    decision: allow
"""


@pytest.fixture
def control():
    return Control(policy=parse_policy(POLICY))


@pytest.fixture(params=["sync", "async"])
def drive(request):
    def call(control: Control, name: str, arguments: dict, executor=lambda: "done", **options):
        if request.param == "sync":
            return control.call(name, arguments, executor, principal="app-agent", **options)

        async def awaited():
            return executor()

        return asyncio.run(control.acall(name, arguments, awaited, principal="app-agent", **options))

    call.kind = request.param
    return call


def alices(action) -> dict:
    return {"resources": ["record:alice:*"]}


def update(owner: str, record_id: str, size: int = 1) -> dict:
    return {"owner": owner, "record_id": record_id, "size": size}


def test_in_scope_runs_and_the_receipt_names_the_scope(control, drive):
    assert drive(control, "records.update", update("alice", "r1"), scope=alices) == "done"
    [receipt] = receipts()
    assert receipt["result"] == "committed" and receipt["scope_hash"].startswith("sha256:")
    assert drive(control, "records.update", update("alice", "r2"), scope=alices) == "done"
    assert receipts()[1]["scope_hash"] == receipt["scope_hash"]  # the same answer, the same hash


def test_out_of_scope_is_refused_before_the_key_is_taken(control, drive):
    ran = []
    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(control, "records.update", update("bob", "r1"), lambda: ran.append(1), scope=alices)
    assert refused.value.reason == "out_of_scope" and ran == []
    assert not EffectRecord.objects.exists()
    [receipt] = receipts()
    assert (receipt["result"], receipt["decision_reason"]) == ("denied", "out_of_scope")
    assert receipt["scope_hash"] is not None
    assert Event.objects.get(type="ACTION_DENIED").data["reason"] == "out_of_scope"


@pytest.mark.parametrize("provider", [
    lambda action: 1 / 0,
    lambda action: None,
    lambda action: {"records": ["x"]},
    lambda action: {"resources": "record:alice:*"},
    lambda action: {"resources": ["record:**:x"]},
    lambda action: {"resources": ["record:alice:*"], "when": 1.5},
])
def test_a_provider_that_cannot_answer_is_scope_unavailable(control, drive, provider):
    ran = []
    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(control, "records.update", update("alice", "r1"), lambda: ran.append(1), scope=provider)
    assert refused.value.reason == "scope_unavailable" and ran == []
    assert receipts()[0]["decision_reason"] == "scope_unavailable"


def test_no_resource_is_out_of_any_scope(control, drive):
    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(control, "notes.write", {"text": "x"}, scope=lambda action: {"resources": ["record:**"]})
    assert refused.value.reason == "out_of_scope"


def test_the_approval_gate_comes_first_and_an_approval_never_widens_the_scope(control, drive):
    asked_scope = []

    def scope(action):
        asked_scope.append(action.resource)
        return alices(action)

    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        drive(control, "records.update", update("bob", "r1", size=99), scope=scope)
    assert asked_scope == []  # nobody's scope is read for a call that only asks
    store.answer_approval(asked.value.request_id, True, by="carol")
    with ctrlrun.with_approval(asked.value.request_id), pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(control, "records.update", update("bob", "r1", size=99), scope=scope)
    assert refused.value.reason == "out_of_scope" and asked_scope == ["record:bob:r1"]
    assert Approval.objects.get(pk=asked.value.request_id).status == "granted"


def test_async_and_sync_providers(control, drive):
    loop_threads = []

    def sync_provider(action):
        loop_threads.append(threading.current_thread())
        return alices(action)

    async def async_provider(action):
        await asyncio.sleep(0)
        return alices(action)

    assert drive(control, "records.update", update("alice", "r1"), scope=sync_provider) == "done"
    assert drive(control, "records.update", update("alice", "r2"), scope=async_provider) == "done"
    if drive.kind == "async":  # a sync provider may read the database: never on the event loop's thread
        assert loop_threads[0] is not threading.main_thread()


def test_observe_mode_runs_and_says_out_of_scope(drive):
    observing = Control(policy=parse_policy(POLICY.replace("schema: ctrlrun.policy/v2",
                                                           "schema: ctrlrun.policy/v3\nmode: observe")))
    ran = []
    drive(observing, "records.update", update("bob", "r1"), lambda: ran.append(1), scope=alices)
    drive(observing, "records.update", update("bob", "r2", size=99), lambda: ran.append(2), scope=alices)
    assert ran == [1, 2]
    first, second = receipts()
    assert first["would_have"]["blocked_reason"] == "out_of_scope"
    assert second["would_have"]["blocked_reason"] == "approval_required"  # the gate (7) before the scope (8)


def test_a_scope_that_is_not_callable_is_refused_at_declaration():
    with pytest.raises(ctrlrun.InvalidArgument, match="scope"):
        ctrlrun.protect("records.update", scope={"resources": ["x"]})
