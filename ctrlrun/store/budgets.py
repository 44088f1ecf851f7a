"""The budget ledger (authority, §C5): charge a call's budgets when it takes its key, give them back
when its attempt ends failed, and read what a grant has spent.

Spent, for one budget, is the sum of the un-released ledger rows of its (grant_id, metric) consumed
inside its window. It is read at a constant cost (docs/budgets.md argues it exact): each pair's rows
form a chain (``n`` = 1, 2, ..., ``cum`` the running total of the amounts, released ones included,
``consumed_at`` never earlier than the predecessor's), so the rows consumed before the window are a
prefix of the chain and what the window holds is the last row's ``cum`` minus the ``cum`` of the last
row before the window (two index seeks), minus the released amounts consumed inside the window (an
index of the released rows alone: bounded by releases, never by the ledger). A reservation checks
every charge and then writes one row per (grant_id, metric), continuing its chain, in the transaction
that takes the key (``effects.reserve``), so N processes racing for a budget's last unit spend it
once:

- SQLite: every write transaction is ``BEGIN IMMEDIATE`` (``standalone.sqlite_options``), so the
  sum and the insert cannot interleave with another writer.
- PostgreSQL: a transaction-scoped advisory lock per (grant_id, metric), taken in sorted order
  before anything is summed. The lock's key is a stable 64-bit digest of the pair (the same in every
  process, unlike Python's ``hash()``). Lock order: effect row, approval row, budget locks, chain head.

A call whose transaction waited for such a lock may read a clock earlier than a row the winner wrote
meanwhile; rows consumed after this transaction's time are therefore counted too (the window has
no upper bound), so a wait can only make a budget stricter, never let it overspend. Its own row is
then stamped with the predecessor's ``consumed_at`` (later than its clock): later only ever keeps a
charge in windows longer, stricter again.

Several budgets on one metric of one grant (``amount`` per hour and per day) share one ledger row per
call: each budget sums the same rows over its own window.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections

from ..errors import BudgetRefused, InvalidArgument
from ..models import BudgetLedger, EffectRecord
from ..policy.authority import MAX_AMOUNT
from ..states import EffectState
from ..values import Charge
from . import sql
from .base import alias, as_datetime, dialect, objects, read_clock, reading, statements, time_param
from .signatures import ledger_mac




def lock_key(grant_id: str, metric: str) -> int:
    """The advisory lock of one (grant_id, metric) on PostgreSQL: a signed 64-bit digest, stable across
    processes and runs."""
    digest = hashlib.sha256(f"ctrlrun.budget\x00{grant_id}\x00{metric}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def distinct(charges: Iterable[Charge]) -> list[Charge]:
    """The charges as ledger rows: one per (grant_id, metric), first seen first. Several budgets on one
    metric of one grant cost the same amount (it is the same argument), so they share a row."""
    rows: dict[tuple[str, str], Charge] = {}
    for charge in charges:
        pair = (charge.grant_id, charge.metric)
        seen = rows.get(pair)
        if seen is None:
            rows[pair] = charge
        elif seen.amount != charge.amount:
            raise InvalidArgument(f"two budget charges on grant {charge.grant_id!r} for metric {charge.metric!r} "
                                  f"cost different amounts ({seen.amount} and {charge.amount}); one call spends "
                                  f"one amount of a metric")
    return list(rows.values())


def _lock(charges: Sequence[Charge]) -> None:
    pairs = sorted({(c.grant_id, c.metric) for c in charges})
    dialect().lock_budgets(statements, [lock_key(grant_id, metric) for grant_id, metric in pairs])


def _number(value: Any) -> int:
    return 0 if value is None else int(value)  # PostgreSQL's SUM of bigints is a numeric


def _spent(charges: Sequence[Charge], when: dt.datetime) -> list[int]:
    """What each charge's budget has spent in its window at ``when`` (one statement for them all)."""
    adapt = time_param(connections[alias()])
    params: list[Any] = []
    for charge in charges:
        since = adapt(when - dt.timedelta(seconds=charge.window_seconds))
        pair = [charge.grant_id, charge.metric]
        params += [*pair, *pair, since, *pair, since]
    with statements() as cursor:
        rows = sorted(cursor.execute(sql.ledger_spent(len(charges)), params).fetchall())
    return [_number(last) - _number(before) - _number(released) for _, last, before, released in rows]


def exhausted(charges: Sequence[Charge], when: dt.datetime, *, lock: bool = True) -> tuple[Charge, int] | None:
    """The first charge (in the order given) that does not fit its budget at ``when``, with what its
    budget has spent; None when every one fits. Must run inside a phase; ``lock`` takes the budgets'
    locks first (a reservation), which are held until the phase ends."""
    if not charges:
        return None
    if lock:
        _lock(charges)
    for charge, spent in zip(charges, _spent(charges, when)):
        if spent + charge.amount > charge.limit:
            return charge, spent
    return None


def _continued(last: Any, connection: Any, row: Charge, when: dt.datetime) -> tuple[int, int, dt.datetime]:
    """Where a charge of ``row.amount`` continues its pair's chain, whose ``last`` row is (n, cum,
    consumed_at) or None: (n, cum, consumed_at)."""
    if last is None:
        return 1, row.amount, when
    n, cum, consumed_at = int(last[0]), int(last[1]), as_datetime(last[2], connection)
    if cum + row.amount > MAX_AMOUNT:
        raise BudgetRefused(f"the budget ledger's running total of {row.metric!r} on grant {row.grant_id!r} would "
                            f"pass {MAX_AMOUNT} (2**63 - 1, what the ledger holds): it cannot charge "
                            f"{row.amount} more; measure this metric in a larger unit", reason="budget_unmeasurable")
    return n + 1, cum + row.amount, max(when, consumed_at) if consumed_at is not None else when


def charge(charges: Sequence[Charge], effect_key: str, attempt: int, when: dt.datetime) -> None:
    """Write the ledger rows of an attempt that took its key (inside the reservation's phase, under
    the budgets' locks), each continuing its (grant_id, metric)'s chain."""
    rows = distinct(charges)
    if not rows:
        return
    connection = connections[alias()]
    adapt = time_param(connection)
    params: list[Any] = []
    with statements() as cursor:
        found = cursor.execute(sql.ledger_last(len(rows)),
                               [value for row in rows for value in (row.grant_id, row.metric)]).fetchall()
        lasts = {int(i): rest for i, *rest in found}
        for index, row in enumerate(rows):
            n, cum, at = _continued(lasts.get(index), connection, row, when)
            params += [row.grant_id, row.metric, row.amount, effect_key, attempt, adapt(at), None, n, cum,
                       ledger_mac(row.grant_id, row.metric, row.amount, effect_key, attempt, at, None, n, cum)]
        cursor.execute(sql.LEDGER_INSERT + sql.value_rows(10, len(rows)), params)


def release(effect_key: str, attempt: int, when: dt.datetime) -> int:
    """Give back an attempt's charges (it ended failed): inside the phase that moves its record to
    ``failed`` (the database allows a release only then), each row signed again with its release.
    How many."""
    connection = connections[alias()]
    stamp = time_param(connection)(when)
    released = 0
    with statements() as cursor:
        held = cursor.execute(sql.LEDGER_HELD, [effect_key, attempt]).fetchall()
        for ident, grant_id, metric, amount, consumed_at, n, cum in held:
            mac = ledger_mac(grant_id, metric, amount, effect_key, attempt, as_datetime(consumed_at, connection), when,
                             n, cum)
            released += cursor.execute(sql.LEDGER_RELEASE, [stamp, mac, ident]).rowcount
    return released


# --------------------------------------------------------------------------- reads


def _states(keys: Iterable[str]) -> dict[str, tuple[str, int]]:
    return {key: (state, attempt) for key, state, attempt in
            objects(EffectRecord).filter(pk__in=set(keys)).values_list("effect_key", "state", "attempt")}


def _row_state(row: BudgetLedger, states: dict[str, tuple[str, int]]) -> str:
    """The state of the attempt that made ``row``: its record's, if the record is still at that attempt.
    A record at a later attempt was renewed from failed, so the row's attempt ended failed."""
    if row.released_at is not None:
        return EffectState.FAILED.value
    state, attempt = states.get(row.effect_key, (None, None))
    if state is None:
        return "missing"
    return str(state) if attempt == row.attempt else EffectState.FAILED.value


def budget_usage(grant_id: str, metric: str, window_seconds: int,
                 now: dt.datetime | None = None) -> tuple[int, int, list[tuple[str, str, int, int, dt.datetime]]]:
    """What one budget has spent in the window ``(now - window, now]`` (``now``: the store's clock by default):
    ``(consumed, held, holding)``. ``consumed`` sums the charges of committed attempts; ``held`` those of
    attempts still running or ambiguous (they count against the budget until they end); ``holding``
    lists the held charges as (effect_key, state, amount, attempt, consumed_at), oldest first.
    Released charges (their attempt failed) count in neither."""
    if not isinstance(window_seconds, int) or isinstance(window_seconds, bool) or window_seconds <= 0:
        raise InvalidArgument(f"a budget's window is a positive number of seconds, got {window_seconds!r}")
    with reading():
        now = now or read_clock()
        rows = list(objects(BudgetLedger).filter(
            grant_id=grant_id, metric=metric, released_at__isnull=True,
            consumed_at__gt=now - dt.timedelta(seconds=window_seconds), consumed_at__lte=now,
        ).order_by("consumed_at", "id"))
        states = _states(r.effect_key for r in rows)
    consumed = held = 0
    holding: list[tuple[str, str, int, int, dt.datetime]] = []
    for row in rows:
        state = _row_state(row, states)
        if state == EffectState.COMMITTED:
            consumed += row.amount
        else:
            held += row.amount
            holding.append((row.effect_key, state, row.amount, row.attempt, row.consumed_at))
    return consumed, held, holding


def ledger_rows() -> int:
    """How many rows the budget ledger holds (released ones included): ``stats``'s ``ledger_rows``."""
    with reading():
        return objects(BudgetLedger).count()


def charges_of(effect_key: str, attempt: int) -> list[tuple[str, str, int, str]]:
    """The charges one attempt made, as (grant_id, metric, amount, standing), in the order written:
    ``spent`` (the attempt committed), ``holds`` (running or ambiguous) or ``released`` (it failed)."""
    with reading():
        rows = list(objects(BudgetLedger).filter(effect_key=effect_key, attempt=attempt).order_by("id"))
        states = _states([effect_key]) if rows else {}
    out = []
    for row in rows:
        state = _row_state(row, states)
        standing = ("spent" if state == EffectState.COMMITTED else
                    "released" if row.released_at is not None else "holds")
        out.append((row.grant_id, row.metric, row.amount, standing))
    return out


def budget_line(charges: Sequence[tuple[str, str, int, str]]) -> str:
    """What ``effects`` appends to an attempt's line: ``  spent 40000 amount on support, 1 count on support``
    and/or ``  holds ...`` (released charges are not shown)."""
    text = ""
    for standing in ("spent", "holds"):
        items = [f"{amount} {metric} on {grant}" for grant, metric, amount, s in charges if s == standing]
        if items:
            text += f"  {standing} " + ", ".join(items)
    return text


__all__ = ["budget_usage", "ledger_rows", "charges_of", "budget_line", "lock_key", "distinct"]
