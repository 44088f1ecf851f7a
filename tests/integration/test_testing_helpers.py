"""``ctrlrun.testing``: the helpers users' own tests get, checked against the real store."""
from __future__ import annotations

import datetime as dt

import pytest

import ctrlrun
from ctrlrun.control import Control
from ctrlrun.testing import (
    Clock,
    ScriptedApprovalProvider,
    assert_never_ran,
    assert_ran_once,
    effect_history,
    isolated_hooks,
    use_clock,
)
from tests.support import make_ambiguous

pytestmark = pytest.mark.usefixtures("store_db")


def test_assert_ran_once_passes_on_one_commit_after_a_not_executed(refund, remote):
    """A NotExecuted attempt then a committed one ran once; the assertion passes."""
    remote.fail_with = ctrlrun.NotExecuted("refused")
    with ctrlrun.context(agent="support-agent"):
        with pytest.raises(ctrlrun.NotExecuted):
            refund(payment_id="t1", amount=5)
        remote.fail_with = None
        refund(payment_id="t1", amount=5)
    assert_ran_once("refund:t1")
    assert effect_history("refund:t1") == {"state": "committed", "attempt": 2, "results": ["failed", "committed"],
                                           "started": 2, "not_executed": 1}


def test_assert_ran_once_fails_on_an_ambiguous_or_missing_effect(refund, remote):
    """An ambiguous effect, or one never attempted, is not 'ran once': the message says what the store says."""
    key = make_ambiguous(refund, remote, "t2")
    with pytest.raises(AssertionError, match="did not run exactly once: the record is ambiguous at attempt 1"):
        assert_ran_once(key)
    with pytest.raises(AssertionError, match="the record is absent"):
        assert_ran_once("refund:never")
    with pytest.raises(AssertionError, match="may have run"):
        assert_never_ran(key)
    assert_never_ran("refund:never")


def test_scripted_provider_refuses_unknown_outcomes():
    """A script word other than grant/deny/ignore is refused when the provider is built."""
    with pytest.raises(ctrlrun.InvalidArgument, match="'approve' is not one of"):
        ScriptedApprovalProvider(["approve"])
    provider = ScriptedApprovalProvider()
    with pytest.raises(ctrlrun.InvalidArgument):
        provider.add("maybe")


def test_clock_moves_forward_only_and_dates_a_controls_calls():
    """Clock.advance moves time (never back); a Control on it dates its receipts by it."""
    clock = Clock(dt.datetime(2031, 5, 1, tzinfo=dt.timezone.utc))
    with pytest.raises(ctrlrun.InvalidArgument, match="only moves forward"):
        clock.advance(seconds=-1)
    with pytest.raises(ctrlrun.InvalidArgument, match="aware"):
        Clock(dt.datetime(2031, 5, 1))
    clock.advance(hours=2)
    Control(clock=clock).call("audit.note", {"text": "x"}, lambda: None, principal="a")
    from tests.support import receipts

    assert receipts()[-1]["finished_at"].startswith("2031-05-01T02:00:00")


def test_use_clock_lapses_a_lease_without_sleeping():
    """use_clock() is the process's store clock inside the block: a held key's lease lapses by advance()."""
    from ctrlrun import store
    from tests.support import hold_key

    with use_clock(Clock()) as clock:
        hold_key("refund:held", minutes=5)
        assert store.sweep_lapsed() == []
        clock.advance(minutes=6)
        assert [e.effect_key for e in store.sweep_lapsed()] == ["refund:held"]


def test_isolated_hooks_starts_empty_and_restores():
    """Hooks registered inside isolated_hooks() are gone after it; those from before come back."""
    from ctrlrun.protect import hook_for

    def outer(key):
        return "unknown"

    ctrlrun.protect("email.send", effect="email:{msg_id}", reconcile=outer)(lambda msg_id: None)
    try:
        with isolated_hooks() as hooks:
            assert hooks == {}
            ctrlrun.protect("audit.note", effect="n:{text}", reconcile=outer)(lambda text: None)
            assert hook_for("audit.note") is outer
        assert hook_for("audit.note") is None and hook_for("email.send") is outer
    finally:
        from ctrlrun.control import PROCESS_HOOKS as _hooks

        _hooks.pop("email.send", None)
