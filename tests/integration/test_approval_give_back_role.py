"""The application's database role against an approval that can be given back (issue 25), on both
databases: consumed -> granted is allowed only with the signed ``returned`` count up by exactly one,
so a signed granted copy of the row from before its last use is refused by the database, and a row
made up by hand (the count raised) is unsigned: presenting it is refused ``ApprovalMismatch(tampered)``
and ``receipts --verify-chain`` names it. The agent runs as OS processes (``RoleStore``)."""
from __future__ import annotations

import pytest

from tests.support import breaks, role_refused, scratch_role_store

pytestmark = pytest.mark.slow

COLUMNS = ("status", "consumed_at", "consumed_by", "returned", "mac")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    with scratch_role_store(request.param, tmp_path) as made:
        yield made


def _approval(store) -> tuple:
    [found] = store.sql(f'SELECT {", ".join(chr(34) + c + chr(34) for c in COLUMNS)} FROM "ctrlrun_approval"')
    return tuple(found)


def _put(store, values: tuple) -> None:
    store.sql(f'UPDATE "ctrlrun_approval" SET {", ".join(f"{chr(34)}{c}{chr(34)} = %s" for c in COLUMNS)}', *values)


def test_an_approval_given_back_then_used_cannot_be_replayed_by_the_role(store):
    refund = {"op": "refund", "payment_id": "t5", "amount": 5000}
    [asked] = store.agent(refund)
    assert asked["error"] == "ApprovalRequired", asked
    [[request_id]] = store.sql('SELECT "approval_id" FROM "ctrlrun_approval"')
    store.one({"op": "answer", "approval": request_id})
    before_first_use = _approval(store)
    (store.folder / "refuse-t5").touch()
    failed = store.one({**refund, "approval": request_id})
    assert failed["error"] == "NotExecuted", failed
    given_back = _approval(store)
    assert (given_back[0], given_back[3]) == ("granted", 1)
    (store.folder / "refuse-t5").unlink()
    assert store.one({**refund, "approval": request_id}) == {"value": "refunded"}  # nobody asked twice
    used = _approval(store)
    assert (used[0], used[3]) == ("consumed", 1)
    assert store.verify()["ok"] is True

    # Each genuine granted copy from before the last use: refused by the database, nothing changes.
    for copy in (before_first_use, given_back):
        with pytest.raises(role_refused(store)):
            _put(store, copy)
        assert _approval(store) == used
    # The count raised by more than one, or not at all: refused too.
    for returned in (1, 3):
        with pytest.raises(role_refused(store)):
            _put(store, ("granted", None, None, returned, given_back[4]))
    # Raised by exactly one, by hand: the database lets it through, but it is not ctrlrun's.
    _put(store, ("granted", None, None, 2, given_back[4]))
    result = store.one({**refund, "approval": request_id})
    assert (result["error"], result["reason"]) == ("ApprovalMismatch", "tampered"), result
    assert store.remote() == ["t5 5000"]  # the NotExecuted attempt never sent; the effect ran once
    assert ("signature_invalid", "approval") in breaks(store.verify())


def test_a_request_cannot_start_with_a_returned_count(store):
    [asked] = store.agent({"op": "refund", "payment_id": "t5", "amount": 5000})
    assert asked["error"] == "ApprovalRequired", asked
    with pytest.raises(role_refused(store)):
        store.sql('UPDATE "ctrlrun_approval" SET "returned" = 1')
    columns = [c for (c,) in store.sql(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'ctrlrun_approval'"
        if store.vendor == "postgresql" else "SELECT name FROM pragma_table_info('ctrlrun_approval')")]
    picked = ", ".join("'apr_" + "1" * 32 + "'" if c == "approval_id" else "1" if c == "returned" else f'"{c}"'
                       for c in columns)
    with pytest.raises(role_refused(store)):
        store.sql(f'INSERT INTO "ctrlrun_approval" ({", ".join(chr(34) + c + chr(34) for c in columns)}) '
                  f'SELECT {picked} FROM "ctrlrun_approval"')
