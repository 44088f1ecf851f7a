"""A phase is one durable transaction, whoever runs it (on SQLite the store's own BEGIN IMMEDIATE and
COMMIT on the driver's connection; on PostgreSQL Django's atomic): what it wrote commits together or
not at all, what waits on its commit runs after it, a savepoint inside it is a savepoint, it refuses
to run inside a caller's transaction, and Django gets its connection back in autocommit."""
from __future__ import annotations

import pytest
from django.db import connections, transaction

from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.errors import InvalidArgument
from ctrlrun.models import Event
from ctrlrun.states import EventType

pytestmark = pytest.mark.usefixtures("store_db")


def _event(note: str):
    return store.chain.event_row(EventType.POLICY_EVALUATED, "act_phase", None, {"note": note},
                                 store.now())


def _notes() -> list[str]:
    return [e.data.get("note") for e in Event.objects.using(store.alias()).filter(action_id="act_phase")]


def _connection():
    return connections[store.alias()]


def test_a_phase_commits_and_hands_django_its_connection_back():
    with store.base.write_phase() as when:
        store.chain.seal([_event("kept")], [], when)
        assert _connection().in_atomic_block  # the ORM inside a phase joins its transaction
    assert _notes() == ["kept"]
    assert _connection().get_autocommit() and not _connection().in_atomic_block
    assert store.verify().ok


def test_a_phase_that_raises_writes_nothing():
    head = store.head_position()
    with pytest.raises(RuntimeError, match="boom"):
        with store.base.write_phase() as when:
            store.chain.seal([_event("lost")], [], when)
            raise RuntimeError("boom")
    assert _notes() == [] and store.head_position() == head
    assert _connection().get_autocommit() and not _connection().in_atomic_block


def test_what_waits_on_the_commit_runs_after_it_and_never_after_a_rollback():
    ran: list[tuple[str, bool]] = []
    with store.base.write_phase():
        transaction.on_commit(lambda: ran.append(("committed", _connection().in_atomic_block)), using=store.alias())
        assert ran == []
    assert ran == [("committed", False)]
    with pytest.raises(RuntimeError):
        with store.base.write_phase():
            transaction.on_commit(lambda: ran.append(("rolled back", False)), using=store.alias())
            raise RuntimeError("no")
    with store.base.write_phase():
        pass
    assert ran == [("committed", False)]


def test_an_atomic_block_inside_a_phase_is_a_savepoint():
    with store.base.write_phase() as when:
        store.chain.seal([_event("outer")], [], when)
        with pytest.raises(ValueError):
            with transaction.atomic(using=store.alias()):
                Event.objects.using(store.alias()).filter(action_id="nobody").exists()
                raise ValueError("inner")
    assert _notes() == ["outer"]


def test_a_phase_inside_a_callers_transaction_is_refused():
    with transaction.atomic(using=store.alias()):
        with pytest.raises(InvalidArgument, match="transaction"):
            Control().call("email.send", {"msg_id": "inside"}, lambda: "sent", principal="mailer")
    assert store.get_effect("email:inside") is None


def test_calls_after_a_refused_phase_still_commit():
    """A refusal (its own phase) and the next call's phases leave no transaction open behind them."""
    control = Control()
    with pytest.raises(Exception):
        control.call("nothing.listed", {}, lambda: "x", principal="mailer")
    assert control.call("email.send", {"msg_id": "after"}, lambda: "sent", principal="mailer") == "sent"
    assert store.get_effect("email:after").state == "committed"
    assert _connection().get_autocommit() and not _connection().in_atomic_block


def test_a_protected_call_inside_a_phase_is_refused_and_runs_nothing():
    """A receiver of a signal the store sends inside a phase (a post_save) that makes a protected call
    must be refused: as a savepoint of the outer phase, its function would run and its record roll back
    with the phase, and a retry would run it again."""
    ran: list[str] = []
    with pytest.raises(InvalidArgument, match="transaction"):
        with store.base.write_phase():
            Control().call("email.send", {"msg_id": "nested"}, lambda: ran.append("sent"), principal="mailer")
    assert ran == [] and store.get_effect("email:nested") is None


def test_a_call_inside_a_callers_manual_transaction_is_refused():
    """``set_autocommit(False)`` is a transaction too: the caller's rollback would take the call's
    evidence with it, after its function ran."""
    ran: list[str] = []
    connection = _connection()
    connection.set_autocommit(False)
    try:
        with pytest.raises(InvalidArgument, match="transaction"):
            Control().call("email.send", {"msg_id": "manual"}, lambda: ran.append("sent"), principal="mailer")
    finally:
        connection.rollback()
        connection.set_autocommit(True)
    assert ran == [] and store.get_effect("email:manual") is None
