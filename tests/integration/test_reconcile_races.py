"""A reconcile answer applies only to the attempt the hook was asked about."""
from __future__ import annotations

import threading

import pytest

import ctrlrun
from ctrlrun import reconcile, store
from ctrlrun.models import Event

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  pay.out:
    effect: "payout:{pid}"
    decision: allow
"""


@pytest.fixture
def payouts(transactional_db, use_policy, hook_registry):
    use_policy(POLICY)


def test_stale_deferred_answer_is_not_applied_to_a_later_attempt(payouts):
    """A slow deferred 'not_executed' about attempt 1 must not fail attempt 2, or the effect runs twice."""
    remote: list[str] = []
    plan = ["lost before the remote acted", "reply lost after the remote acted", "ok"]
    answered, proceed = threading.Event(), threading.Event()

    def ask_remote(key: str) -> str:
        answer = "committed" if key.removeprefix("payout:") in remote else "not_executed"
        if threading.current_thread().name == "deferred":
            answered.set()
            proceed.wait(10)  # the deferred pass is slow to write its answer
        return answer

    @ctrlrun.protect("pay.out", effect="payout:{pid}", reconcile=ask_remote)
    def payout(pid: str) -> str:
        kind = plan.pop(0)
        if kind.startswith("lost"):
            raise TimeoutError(kind)
        remote.append(pid)
        if kind.startswith("reply"):
            raise TimeoutError(kind)
        return "paid"

    with ctrlrun.context(agent="payout-agent"):
        with pytest.raises(TimeoutError):
            payout(pid="p1")  # attempt 1: ambiguous, the remote has nothing
        reports: list = []
        deferred = threading.Thread(target=lambda: reports.append(reconcile.run_once()), name="deferred")
        deferred.start()
        assert answered.wait(10)
        with pytest.raises(TimeoutError):
            payout(pid="p1")  # blocking trigger: failed -> attempt 2 runs, the remote acts, reply lost
        proceed.set()
        deferred.join(10)
        effect = store.get_effect("payout:p1")
        assert (effect.state, effect.attempt) == ("ambiguous", 2)  # the stale answer was dropped
        [line] = reports[0].lines
        assert (line.effect_key, line.outcome) == ("payout:p1", "dropped")  # and reported as such
        with pytest.raises(ctrlrun.DuplicateEffect):
            payout(pid="p1")  # the hook (now about attempt 2) finds the payout: committed
    assert remote == ["p1"]
    dropped = [e for e in Event.objects.filter(type="RECONCILIATION_RESOLVED") if "dropped" in e.data]
    assert len(dropped) == 1 and "about attempt 1" in dropped[0].data["dropped"]
