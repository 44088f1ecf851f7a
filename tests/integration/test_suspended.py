"""``ctrlrun.Suspended`` and ``Control.resume`` (spec A5): a held reservation across a round trip.

The observed run of the spec, then the attacks: a replayed continuation, two OS processes resuming
the same one at once, a forged continuation row, and a resume after the suspension lapsed.
"""
from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from django.utils import timezone

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.models import Continuation, EffectRecord, Event, Receipt
from tests.support import events, receipts, run_together, script_environment

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  email.send:
    effect: "email:{message_id}"
    decision: allow
"""


@pytest.fixture
def control(tmp_path):
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(POLICY)
    return Control.from_file(path)


def suspend(control, token="cont-123", key="m1"):
    def executor():
        raise ctrlrun.Suspended(token)

    with pytest.raises(ctrlrun.Suspended) as raised:
        control.call("email.send", {"message_id": key}, executor, principal="mailer")
    return raised.value


def data_of(type_):
    return [e.data for e in Event.objects.filter(type=type_).order_by("id")]


def test_the_observed_run_suspend_then_resume_commits_once(control):
    """Suspended leaves the row executing with a lease and no receipt; resume commits attempt 1 with
    EXECUTION_SUSPENDED {held, round 1} and EXECUTION_RESUMED {round 1} between start and commit."""
    raised = suspend(control)
    assert raised.round == 1 and raised.effect_key == "email:m1"
    record = EffectRecord.objects.get(pk="email:m1")
    assert record.state == "executing" and record.lease_expires_at is not None and not record.pending
    assert Receipt.objects.count() == 0
    assert store.continuation_rounds("email:m1") == 1
    assert control.resume("cont-123", lambda: "sent") == "sent"
    assert EffectRecord.objects.get(pk="email:m1").state == "committed"
    [receipt] = receipts()
    assert receipt["result"] == "committed" and receipt["attempt"] == 1
    assert events()[-4:] == ["EXECUTION_STARTED", "EXECUTION_SUSPENDED", "EXECUTION_RESUMED", "EXECUTION_COMMITTED"]
    assert data_of("EXECUTION_SUSPENDED") == [{"held": True, "round": 1}]
    assert data_of("EXECUTION_RESUMED") == [{"round": 1}]
    assert store.verify().ok


def test_a_replayed_continuation_is_refused(control):
    """A second resume with the same token: InvalidArgument, the executor never runs, nothing written."""
    suspend(control)
    control.resume("cont-123", lambda: "sent")
    written = Event.objects.count()
    ran = []
    with pytest.raises(ctrlrun.InvalidArgument, match="no held suspension matches this continuation"):
        control.resume("cont-123", lambda: ran.append(1))
    assert ran == [] and Event.objects.count() == written
    with pytest.raises(ctrlrun.InvalidArgument, match="no held suspension"):
        control.resume("never-issued", lambda: ran.append(1))


def test_a_suspended_key_stays_held_and_rounds_count(control):
    """While suspended, another call on the key is refused as in progress; a resume that suspends
    again is round 2 under a new token, and the old token is spent."""
    suspend(control)
    with pytest.raises(ctrlrun.DuplicateEffect, match="is executing") as busy:
        control.call("email.send", {"message_id": "m1"}, lambda: "again", principal="mailer")
    assert busy.value.state == "in_progress"

    def again():
        raise ctrlrun.Suspended(b"cont-2")

    with pytest.raises(ctrlrun.Suspended) as second:
        control.resume("cont-123", again)
    assert second.value.round == 2
    with pytest.raises(ctrlrun.InvalidArgument):
        control.resume("cont-123", lambda: "x")
    assert control.resume(b"cont-2", lambda: "sent") == "sent"
    assert data_of("EXECUTION_SUSPENDED") == [{"held": True, "round": 1}, {"held": True, "round": 2}]
    assert [r["result"] for r in receipts() if r.get("effect_key") == "email:m1"][-1:] == ["committed"]


def test_async_resume_awaits_an_async_executor(control):
    async def scenario():
        async def executor():
            raise ctrlrun.Suspended("cont-a")

        with pytest.raises(ctrlrun.Suspended):
            await control.acall("email.send", {"message_id": "m2"}, executor, principal="mailer")

        async def finish():
            return "sent"

        return await control.aresume("cont-a", finish)

    assert asyncio.run(scenario()) == "sent"
    assert EffectRecord.objects.get(pk="email:m2").state == "committed"


def test_a_forged_continuation_row_is_refused(control):
    """A row written around ctrlrun (its token digest or its call changed) fails its signature."""
    suspend(control)
    row = Continuation.objects.get(pk="email:m1")
    forged = store.continuations.digest("attacker-token")
    Continuation.objects.filter(pk=row.pk).update(continuation=forged)
    ran = []
    with pytest.raises(ctrlrun.InvalidArgument, match="does not carry ctrlrun's signature"):
        control.resume("attacker-token", lambda: ran.append(1))
    assert ran == [] and EffectRecord.objects.get(pk="email:m1").state == "executing"


def test_a_resume_after_the_suspension_lapsed_is_refused_and_the_sweep_records_it_ambiguous(tmp_path):
    """Past suspend_timeout the suspension lapses like a lease: no resume, the sweeper marks it ambiguous."""
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(POLICY)
    moment = [timezone.now()]
    control = Control(path, clock=lambda: moment[0], suspend_timeout=dt.timedelta(minutes=5),
                      lease=dt.timedelta(seconds=30))
    suspend(control)
    moment[0] += dt.timedelta(minutes=6)
    ran = []
    with pytest.raises(ctrlrun.InvalidArgument, match="lapsed"):
        control.resume("cont-123", lambda: ran.append(1))
    assert ran == []
    with control.scope():
        swept = store.sweep_lapsed()
    assert [s.effect_key for s in swept] == ["email:m1"]
    assert EffectRecord.objects.get(pk="email:m1").state == "ambiguous"
    assert [r["result"] for r in receipts()] == ["ambiguous"]


RESUMER = """
import sys, time, json
import ctrlrun
ctrlrun.setup()
from ctrlrun.control import default_control

start_at, worker = float(sys.argv[1]), sys.argv[2]
while time.time() < start_at:
    time.sleep(0.001)
try:
    print(json.dumps({"won": default_control().resume("cont-race", lambda: worker)}))
except ctrlrun.InvalidArgument as exc:
    print(json.dumps({"refused": str(exc)}))
"""


def test_two_processes_resuming_the_same_continuation_exactly_one_wins(transactional_db, tmp_path):
    import json
    import time

    env = script_environment(tmp_path, POLICY)
    (tmp_path / "resumer.py").write_text(RESUMER)
    from ctrlrun.control import default_control

    suspend(default_control(), token="cont-race", key="race")
    start_at = time.time() + 4.0
    outputs = [json.loads(o) for o in run_together(tmp_path, "resumer.py", [[str(start_at), "a"], [str(start_at), "b"]],
                                                    env)]
    won = [o for o in outputs if "won" in o]
    assert len(won) == 1 and len([o for o in outputs if "refused" in o]) == 1, outputs
    assert EffectRecord.objects.get(pk="email:race").state == "committed"
    assert [r["result"] for r in receipts()] == ["committed"]
