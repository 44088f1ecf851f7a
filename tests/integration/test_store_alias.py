"""``store.using(alias)``: the store's functions run against another configured database, and the
store's per-process caches never take one database's state for another's."""
from __future__ import annotations

import asyncio

import pytest
from django.db import connections

import ctrlrun
from ctrlrun import store
from ctrlrun.models import EffectRecord, PolicyDocument, Receipt
from tests.support import evidence_guard

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


@pytest.fixture(autouse=True)
def other_guarded(store_db):
    """The second database carries the guard too (its migrations installed it); lifted for its flush."""
    evidence_guard().install(connections["other"])
    yield
    evidence_guard().remove(connections["other"])


def test_using_routes_the_alias_and_restores_it():
    """Inside using('other') the store's alias is 'other'; outside, the configured one again."""
    assert store.alias() == "default"
    with store.using("other") as alias:
        assert alias == "other" and store.alias() == "other" and store.base.alias() == "other"
    assert store.alias() == "default"


def test_using_an_unknown_alias_is_refused():
    """An alias settings.DATABASES does not have is a bad argument, named."""
    with pytest.raises(ctrlrun.InvalidArgument, match="no such database alias"):
        with store.using("nope"):
            pass


def test_a_protected_call_under_using_writes_only_to_that_database(refund, agent):
    """The record, the events and the receipt of a call made under using('other') land there, not in default."""
    refund(payment_id="warm", amount=1)  # the runtime (policy) is loaded against default first
    with store.using("other"):
        refund(payment_id="elsewhere", amount=1)
        assert store.get_effect("refund:elsewhere").state == "committed"
        assert store.verify().ok
    assert EffectRecord.objects.using("other").filter(pk="refund:elsewhere").exists()
    assert not EffectRecord.objects.filter(pk="refund:elsewhere").exists()
    assert Receipt.objects.using("other").count() == 1 and Receipt.objects.count() == 1
    assert store.verify().ok and store.get_effect("refund:elsewhere") is None


def test_the_known_policies_cache_is_per_database():
    """A policy stored on default is still stored on 'other' the first time it is ensured there."""
    args = ("sha256:" + "ab" * 32, "ctrlrun.policy/v2", "test", "actions: {}\n", "production")
    store.ensure_policy(*args)
    assert PolicyDocument.objects.filter(pk=args[0]).exists()
    assert not PolicyDocument.objects.using("other").filter(pk=args[0]).exists()
    with store.using("other"):
        store.ensure_policy(*args)
    assert PolicyDocument.objects.using("other").filter(pk=args[0]).exists()


def test_two_controls_on_two_databases_keep_apart(agent):
    """Control(database='other') writes its calls, and its policy's row, to that database only; the
    default Control's calls stay in default; each chain verifies on its own."""
    from ctrlrun.control import Control, default_control

    tenant = Control(database="other")
    ran = []

    @ctrlrun.protect("email.send", effect="email:{msg_id}", control=tenant)
    def send_for_tenant(msg_id: str) -> str:
        ran.append(("tenant", msg_id))
        return "sent"

    @ctrlrun.protect("email.send", effect="email:{msg_id}")
    def send(msg_id: str) -> str:
        ran.append(("default", msg_id))
        return "sent"

    send_for_tenant(msg_id="m1")
    send(msg_id="m1")  # the same key, in another database: a different effect
    assert ran == [("tenant", "m1"), ("default", "m1")]
    policy_hash = default_control().policy.hash
    assert PolicyDocument.objects.using("other").filter(pk=policy_hash).exists()
    assert Receipt.objects.using("other").count() == 1 and Receipt.objects.count() == 1
    with store.using("other"):
        assert store.verify().ok
    assert store.verify().ok


def test_the_default_control_stores_its_policy_in_a_using_block(refund, agent):
    """A call under store.using('other') stores the policy's row there before its receipt names it."""
    from ctrlrun.control import default_control

    refund(payment_id="warm", amount=1)
    with store.using("other"):
        refund(payment_id="there", amount=1)
    assert PolicyDocument.objects.using("other").filter(pk=default_control().policy.hash).exists()


def test_a_slow_call_on_a_controls_database_keeps_its_lease(agent):
    """The heartbeat renews the lease where the record is (the Control's database): a second caller
    during a call three leases long is refused, and the effect runs once."""
    import datetime as dt
    import threading
    import time

    from ctrlrun.control import Control

    tenant = Control(database="other", lease=dt.timedelta(seconds=0.3))
    ran = []

    def hook(key):  # the remote knows nothing yet: the first call is still in flight
        return "not_executed"

    @ctrlrun.protect("email.send", effect="email:{msg_id}", control=tenant, reconcile=hook)
    def send(msg_id: str) -> str:
        ran.append(msg_id)
        time.sleep(1.0)
        return "sent"

    def first():
        with ctrlrun.context(agent="a"):
            send(msg_id="m2")

    worker = threading.Thread(target=first)
    worker.start()
    time.sleep(0.7)  # past the lease, inside the function: only renewals keep the key held
    with pytest.raises(ctrlrun.DuplicateEffect):
        send(msg_id="m2")
    worker.join()
    assert ran == ["m2"]
    with store.using("other"):
        assert store.get_effect("email:m2").state == "committed"


def test_openai_interruption_under_store_using_names_its_ctrlrun_request():
    """Inside store.using('other'), the OpenAI adapter's approval request is read from that database,
    and the interruption names it."""
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel, assistant_message, function_call

    from ctrlrun.adapters.openai_agents import guarded_tool, request_for

    def refund(payment_id: str, amount: int) -> str:
        """Refund."""
        return "refunded"

    tool = guarded_tool(ctrlrun.Control(), "stripe.refund", refund, principal="a")
    model = ScriptedModel([[function_call(tool.name, {"payment_id": "t", "amount": 200_000}, call_id="c1")],
                           [assistant_message("done")]])

    async def go():
        with store.using("other"):
            return await Runner.run(Agent(name="x", model=model, tools=[tool]), "go",
                                    run_config=RunConfig(tracing_disabled=True))

    result = asyncio.run(go())
    assert len(result.interruptions) == 1
    assert request_for(tool, result.interruptions[0]) is not None
