"""Clock skew (spec §F9): a host whose clock disagrees with the database's is named in the evidence.

The agent runs as an OS process under faketime, against a scratch store of its own. On PostgreSQL the
store's clock is the server's, so a host 30 s ahead is measured and ``CLOCK_SKEW_DETECTED`` recorded,
once per episode, while every call goes through. On SQLite the host's clock is the store's clock:
there is nothing to compare, and nothing is recorded.
"""
from __future__ import annotations

import json

import pytest

from tests.support import scratch_store, skewed_agent

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def vendor(request):
    return request.param


def _skew_events(store) -> list[dict]:
    rows = store.sql('SELECT "data" FROM "ctrlrun_event" WHERE "type" = \'CLOCK_SKEW_DETECTED\' ORDER BY "seq"')
    return [json.loads(data) if isinstance(data, str) else data for (data,) in rows]


def test_a_host_ahead_of_the_database_is_recorded_once_per_episode(vendor, tmp_path):
    with scratch_store(vendor, tmp_path, tag="skew") as store:
        # 30 s ahead for three calls (one episode), back in step for two (the episode ends), ahead again.
        done = skewed_agent(store, "+30s", ["call", "call", "call", "+0", "call", "call", "+30s", "call", "call"])
        assert done == ["hello"] * 7  # the calls went through: skew is reported, never a failure
        events = _skew_events(store)
        report = store.verify()
        assert report["ok"] is True, report
    if vendor == "sqlite":
        assert events == []  # the host's clock is the store's clock: nothing to compare
        return
    assert len(events) == 2, events
    for data in events:
        assert data["direction"] == "ahead" and data["trigger"] in ("open", "interval"), data
        assert 29_000_000 <= data["skew_us"] <= 31_000_000 + data["bound_us"], data
        assert data["threshold_us"] == 1_000_000
        assert set(data) == {"skew_us", "bound_us", "threshold_us", "direction", "trigger", "measured_at", "host"}
    assert events[0]["trigger"] == "open" and events[1]["trigger"] == "interval"


def test_a_host_behind_is_named_behind_and_a_host_in_step_records_nothing(vendor, tmp_path):
    with scratch_store(vendor, tmp_path, tag="skew") as store:
        assert skewed_agent(store, "+0", ["call", "call"]) == ["hello", "hello"]
        assert _skew_events(store) == []
        assert skewed_agent(store, "-5s", ["call"]) == ["hello"]
        events = _skew_events(store)
    if vendor == "sqlite":
        assert events == []
        return
    assert [e["direction"] for e in events] == ["behind"], events


@pytest.mark.usefixtures("store_db")
def test_a_skew_check_that_cannot_be_made_never_fails_the_call(refund, settings, caplog):
    """A threshold that does not read (the measurement cannot be made): the call goes through, and on
    PostgreSQL the problem is logged; on SQLite nothing is measured, so nothing is said."""
    from django.db import connection

    from ctrlrun.store import clock
    from tests.support import pay, receipts

    clock.reset()
    settings.CTRLRUN_CLOCK_SKEW_THRESHOLD_SECONDS = "soon"
    try:
        with caplog.at_level("WARNING", logger="ctrlrun.clock"):
            pay(refund, "txn_1")
    finally:
        clock.reset()
    assert [r["result"] for r in receipts()] == ["committed"]
    said = [r.getMessage() for r in caplog.records if r.name == "ctrlrun.clock"]
    if connection.vendor == "postgresql":
        assert len(said) == 1 and "CTRLRUN_CLOCK_SKEW_THRESHOLD_SECONDS" in said[0], said
    else:
        assert said == []
