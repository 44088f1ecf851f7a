"""Two people answering the same thing at the same moment, from two OS processes on the real store
(the console and the commands both answer through ``store.answer_approval`` and ``store.resolve``):
each request gets exactly one answer, each ambiguous record exactly one resolution, the other person
is told it was already decided, and the evidence agrees with the rows."""
from __future__ import annotations

import json
import time

import pytest

from ctrlrun import conf, store
from ctrlrun.models import Approval, EffectRecord, Event
from tests.support import REFUND_POLICY, ask, make_ambiguous, run_together, script_environment

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db")

PERSON = """
import json, sys, time
import ctrlrun
ctrlrun.setup()
from ctrlrun import store
from ctrlrun.errors import CTRLRunError

start_at, mode, who, ids = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
store.now()  # Django and the store are ready before the start
while time.time() < start_at:
    time.sleep(0.001)
out = {}
for item in ids:
    try:
        if mode in ("approve", "deny"):
            store.answer_approval(item, mode == "approve", by=who, note=f"{who} says {mode}")
        else:
            store.resolve(item, mode, by=who, reason=f"{who} checked the remote", attempt=1)
        out[item] = "won"
    except CTRLRunError as exc:
        out[item] = "refused: " + str(exc)
print(json.dumps(out))
"""


def race(tmp_path, first: list[str], second: list[str]) -> list[dict[str, str]]:
    (tmp_path / "person.py").write_text(PERSON)
    env = script_environment(tmp_path, REFUND_POLICY)
    env["CTRLRUN_ENVIRONMENT"] = conf.environment()
    start_at = str(time.time() + 5.0)
    return [json.loads(out) for out in run_together(tmp_path, "person.py", [[start_at, *first], [start_at, *second]],
                                                    env)]


@pytest.mark.slow
def test_an_approver_and_a_denier_at_the_same_moment_give_each_request_one_answer(refund, tmp_path):
    requests = [ask(refund, f"txn_{n}") for n in range(12)]
    ana, bob = race(tmp_path, ["approve", "ana", *requests], ["deny", "bob", *requests[::-1]])
    for request_id in requests:
        outcomes = sorted([ana[request_id][:4], bob[request_id][:4]])
        assert outcomes == ["refu", "won"], (request_id, ana[request_id], bob[request_id])
        winner, verb = ("ana", "granted") if ana[request_id] == "won" else ("bob", "denied")
        loser = bob[request_id] if winner == "ana" else ana[request_id]
        assert "already" in loser, loser  # told plainly it was answered meanwhile
        row = Approval.objects.get(pk=request_id)
        assert (row.status, row.approver) == (verb, winner)
        answers = Event.objects.filter(approval_id=request_id, type__in=["APPROVAL_GRANTED", "APPROVAL_DENIED"])
        assert [(e.type, e.data["approver"]) for e in answers] == [(f"APPROVAL_{verb.upper()}", winner)]
    assert store.verify().ok


@pytest.mark.slow
def test_two_resolvers_at_the_same_moment_give_each_record_one_resolution(refund, remote, tmp_path):
    keys = [make_ambiguous(refund, remote, f"txn_{n}") for n in range(12)]
    rita, sam = race(tmp_path, ["committed", "rita", *keys], ["failed", "sam", *keys[::-1]])
    for key in keys:
        assert sorted([rita[key][:4], sam[key][:4]]) == ["refu", "won"], (key, rita[key], sam[key])
        winner, state = ("rita", "committed") if rita[key] == "won" else ("sam", "failed")
        record = EffectRecord.objects.get(pk=key)
        assert (record.state, record.resolved_by) == (state, winner)
        resolved = Event.objects.filter(effect_key=key, type="EFFECT_RESOLVED")
        assert [(e.data["state"], e.data["resolver"]) for e in resolved] == [(state, winner)]
    assert store.verify().ok
