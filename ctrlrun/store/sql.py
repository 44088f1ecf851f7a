"""Every statement an allowed call makes, named, in one file (the hot path is plain SQL).

An allowed call with an effect key runs, in order: ``OPEN_SQLITE``/``OPEN_POSTGRESQL`` (the key's
record, locked, with the chain head), ``EFFECT_INSERT`` (or ``EFFECT_RENEW``), then while the
function runs ``LEASE_RENEW``, then ``OUTCOME_UPDATE_AT``/``OUTCOME_UPDATE_NOW``, ``HEAD_TAKE``,
``EVENT_INSERT`` + ``RECEIPT_INSERT`` and ``HEAD_MOVE`` (one statement on PostgreSQL). A call on a
budget adds ``BUDGET_LOCK`` (PostgreSQL), ``ledger_spent``, ``ledger_last`` and ``LEDGER_INSERT`` to its reservation
(``LEDGER_HELD``/``LEDGER_RELEASE`` when the attempt fails); a call by a delegated agent adds
``delegations_up`` (its delegations and their ancestors) and ``delegations_revoked``.

Parameters are ``%s`` (the raw cursor turns them into SQLite's ``?``). Every statement that writes
an effect record's state takes the target state as its FIRST parameter and (except the insert,
from ``new``) the source state as its LAST: ``effects.move_effect`` fills both, after checking the edge
against ``states.TRANSITIONS``.
"""
from __future__ import annotations

__all__ = [
    "CLOCK", "HEAD_TAKE", "HEAD_CREATE", "HEAD_MOVE", "EVENT_INSERT", "RECEIPT_INSERT", "PEEK_COLUMNS", "PEEK",
    "OPEN_POSTGRESQL", "OPEN_SQLITE", "EFFECT_INSERT", "EFFECT_RENEW", "LEASE_RENEW", "EFFECT_LAPSE",
    "OUTCOME_UPDATE_NOW", "OUTCOME_UPDATE_AT", "EFFECT_RESOLVE", "RECONCILE_BACKOFF", "LATER_HISTORY",
    "BUDGET_LOCK", "LEDGER_SPENT", "LEDGER_LAST", "ledger_spent", "ledger_last", "LEDGER_INSERT", "LEDGER_HELD",
    "LEDGER_RELEASE", "DELEGATION_COLUMNS",
    "delegations_up", "DELEGATIONS_DOWN", "delegations_revoked", "value_rows", "SUSPEND_HOLD",
]


def value_rows(width: int, count: int) -> str:
    """``count`` groups of ``width`` parameters, for a multi-row ``... VALUES `` statement."""
    return ",".join(["(" + ",".join(["%s"] * width) + ")"] * count)


# --------------------------------------------------------------------------- the clock and the chain head

#: PostgreSQL's clock, when a phase needs the time before any other statement brings it.
CLOCK = "SELECT now()"

#: Lock the head and advance both chains by (receipts, events); returns the new seqs, the old hashes.
HEAD_TAKE = ('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" + %s, "event_seq" = "event_seq" + %s WHERE "id" = 1 '
             'RETURNING "seq", "hash", "event_seq", "event_hash", "mac", "key_id"')

#: The genesis head of an emptied store (a test flush); a concurrent first writer's insert does nothing.
HEAD_CREATE = ('INSERT INTO "ctrlrun_chainhead" ("id","seq","hash","event_seq","event_hash") VALUES (1, 0, %s, 0, %s) '
               'ON CONFLICT ("id") DO NOTHING RETURNING "id"')

#: Move the head to the new last hashes, signed.
HEAD_MOVE = ('UPDATE "ctrlrun_chainhead" SET "hash" = %s, "event_hash" = %s, "mac" = %s, "key_id" = %s '
             'WHERE "id" = 1')

#: Append events: the caller adds one ``(%s x 9)`` group per event.
EVENT_INSERT = ('INSERT INTO "ctrlrun_event" ("ts","type","action_id","effect_key","approval_id","data","seq",'
                '"prev_hash","hash") VALUES ')

#: Append receipts: the caller adds one ``(%s x 12)`` group per receipt.
RECEIPT_INSERT = ('INSERT INTO "ctrlrun_receipt" ("receipt_id","seq","action_id","action","agent","decision",'
                  '"result","effect_key","ts","document","prev_hash","hash") VALUES ')

# --------------------------------------------------------------------------- reading a record

#: The columns a decision needs from an effect record.
PEEK_COLUMNS = ('"action","state","action_id","attempt","lease_expires_at","error","resolved_by","reconcile_failures",'
                '"reconcile_after","created_at","updated_at","pending","mac"')

#: One effect record's deciding columns (``FOR UPDATE`` added where the database has it).
PEEK = f'SELECT {PEEK_COLUMNS} FROM "ctrlrun_effectrecord" WHERE "effect_key" = %s'

#: Evidence past the head (a receipt or event added without moving it) would make every later write
#: collide: a call must not act then. ``max()`` over a unique column reads one end of its index on
#: both databases, whatever the planner's statistics say (a range ``EXISTS`` was planned as a scan).
_BEYOND_HEAD = ('(COALESCE((SELECT max("seq") FROM "ctrlrun_receipt"), 0) > h."seq" OR '
                'COALESCE((SELECT max("seq") FROM "ctrlrun_event"), 0) > h."event_seq")')

#: A reservation's first statement on PostgreSQL: the time, the head, evidence past it, the record (locked).
OPEN_POSTGRESQL = (
    'SELECT now(), h."seq", h."hash", h."event_seq", h."event_hash", h."mac", h."key_id", ' + _BEYOND_HEAD + ', r.* '
    'FROM (SELECT 1) AS one LEFT JOIN "ctrlrun_chainhead" AS h ON h."id" = 1 LEFT JOIN LATERAL (SELECT '
    + PEEK_COLUMNS + ' FROM "ctrlrun_effectrecord" WHERE "effect_key" = %s FOR UPDATE) AS r ON true')

#: The same on SQLite (the transaction is ``BEGIN IMMEDIATE``: nothing else writes meanwhile).
OPEN_SQLITE = (
    'SELECT h."seq", h."hash", h."event_seq", h."event_hash", h."mac", h."key_id", ' + _BEYOND_HEAD + ', '
    + ", ".join(f"r.{column}" for column in PEEK_COLUMNS.split(",")) + ' FROM (SELECT 1) AS one '
    'LEFT JOIN "ctrlrun_chainhead" AS h ON h."id" = 1 LEFT JOIN "ctrlrun_effectrecord" AS r ON r."effect_key" = %s')

#: What the event chain says about a failed record before a retry renews it (rare).
LATER_HISTORY = ('SELECT "type", "data" FROM "ctrlrun_event" WHERE "effect_key" = %s AND "type" IN '
                 "('EFFECT_RESERVED', 'EXECUTION_COMMITTED', 'EFFECT_RESOLVED')")

# --------------------------------------------------------------------------- state writes (target first, source last)

#: new -> executing: a first reservation; losing the race to a concurrent one returns no row.
EFFECT_INSERT = (
    'INSERT INTO "ctrlrun_effectrecord" ("state","effect_key","action","action_id","attempt",'
    '"lease_expires_at","reconcile_failures","created_at","updated_at","pending","mac") '
    'VALUES (%s,%s,%s,%s,1,%s,0,%s,%s,%s,%s) ON CONFLICT ("effect_key") DO NOTHING RETURNING "attempt"')

#: failed -> executing: a retry takes the key at the next attempt.
EFFECT_RENEW = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "action" = %s, "action_id" = %s, "attempt" = %s, '
    '"lease_expires_at" = %s, "result_json" = NULL, "error" = NULL, "resolved_by" = NULL, '
    '"reconcile_failures" = 0, "reconcile_after" = NULL, "updated_at" = %s, "pending" = %s, "mac" = %s '
    'WHERE "effect_key" = %s AND "attempt" = %s AND "state" = %s')

#: executing -> executing: the heartbeat moves a live holder's lease later (never earlier).
LEASE_RENEW = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "lease_expires_at" = %s, "mac" = %s WHERE "effect_key" = %s '
    'AND "action_id" = %s AND "attempt" = %s AND "lease_expires_at" <= %s AND "state" = %s')

#: executing -> ambiguous: a lapsed lease swept (its worker's opening events leave the record).
EFFECT_LAPSE = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "error" = %s, "lease_expires_at" = NULL, '
    '"pending" = NULL, "updated_at" = %s, "mac" = %s WHERE "effect_key" = %s AND "state" = %s')

_OUTCOME_UPDATE = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "lease_expires_at" = NULL, "error" = %s, "result_json" = %s, '
    '"updated_at" = {time}, "pending" = NULL, "mac" = %s WHERE "effect_key" = %s AND "action_id" = %s AND '
    '"attempt" = %s AND "resolved_by" IS NULL AND "state" = %s{returning}'
)
#: executing -> committed | failed | ambiguous (or ambiguous -> ambiguous), if this attempt still holds
#: the row; PostgreSQL: the row's time and the phase's come from the one statement (the transaction's now()).
OUTCOME_UPDATE_NOW = _OUTCOME_UPDATE.format(time="now()", returning=' RETURNING now()')
#: The same with the phase's time as a parameter (SQLite, a test clock).
OUTCOME_UPDATE_AT = _OUTCOME_UPDATE.format(time="%s", returning="")

#: ambiguous -> committed | failed: a reconcile hook's or a person's answer.
EFFECT_RESOLVE = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "error" = %s, "resolved_by" = %s, "reconcile_after" = NULL, '
    '"updated_at" = %s, "mac" = %s WHERE "effect_key" = %s AND "state" = %s')

#: ambiguous -> ambiguous: a hook could not say; the next deferred attempt waits longer.
RECONCILE_BACKOFF = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "reconcile_failures" = "reconcile_failures" + 1, '
    '"reconcile_after" = %s WHERE "effect_key" = %s AND "state" = %s')

# --------------------------------------------------------------------------- budgets (the ledger)

#: PostgreSQL: one (grant, metric)'s budget, locked until the phase ends (SQLite: BEGIN IMMEDIATE).
BUDGET_LOCK = "SELECT pg_advisory_xact_lock(%s)"

_CHAIN = '"ctrlrun_budgetledger" WHERE "grant_id" = %s AND "metric" = %s'

#: One budget's window as a check needs it, in two index seeks and one range of the released rows
#: (``ctrlrun_ledger_chain_idx``, ``ctrlrun_ledger_released_idx``): the running total at its chain's
#: last row, at the chain's last row consumed by the window's start (consumed_at never goes back along
#: the chain, so those rows are a prefix of it; cum never goes down, so the prefix's largest cum is its
#: last row's), and the released amounts consumed after the start.
#: Parameters: (grant, metric) three times, the window's start after the second and the third.
LEDGER_SPENT = (
    f'SELECT (SELECT "cum" FROM {_CHAIN} ORDER BY "consumed_at" DESC, "cum" DESC LIMIT 1), '
    f'(SELECT "cum" FROM {_CHAIN} AND "consumed_at" <= %s ORDER BY "consumed_at" DESC, "cum" DESC LIMIT 1), '
    f'(SELECT SUM("amount") FROM {_CHAIN} AND "released_at" IS NOT NULL AND "consumed_at" > %s)')

#: A chain's last row (a charge continues it): its place, running total and time (the unique index of
#: ``ctrlrun_ledger_one_place``, read backwards).
LEDGER_LAST = f'SELECT "n", "cum", "consumed_at" FROM {_CHAIN} ORDER BY "n" DESC LIMIT 1'


def ledger_spent(count: int) -> str:
    """``LEDGER_SPENT`` for ``count`` budgets in one statement, a row each, numbered from 0 first."""
    return " UNION ALL ".join(f"SELECT {i} AS \"i\", * FROM ({LEDGER_SPENT}) AS \"s{i}\"" for i in range(count))


def ledger_last(count: int) -> str:
    """``LEDGER_LAST`` for ``count`` chains in one statement: a row for each that has one, numbered
    from 0 first (parameters: each chain's grant and metric)."""
    return " UNION ALL ".join(f"SELECT {i} AS \"i\", * FROM ({LEDGER_LAST}) AS \"l{i}\"" for i in range(count))


#: An attempt's charges: the caller adds ``value_rows(10, n)``.
LEDGER_INSERT = ('INSERT INTO "ctrlrun_budgetledger" ("grant_id", "metric", "amount", "effect_key", "attempt", '
                 '"consumed_at", "released_at", "n", "cum", "mac") VALUES ')

#: An attempt's charges still held.
LEDGER_HELD = ('SELECT "id", "grant_id", "metric", "amount", "consumed_at", "n", "cum" FROM "ctrlrun_budgetledger" '
               'WHERE '
               '"effect_key" = %s AND "attempt" = %s AND "released_at" IS NULL')

#: Release one charge (the guard lets a row get released_at once, nothing else).
LEDGER_RELEASE = ('UPDATE "ctrlrun_budgetledger" SET "released_at" = %s, "mac" = %s WHERE "id" = %s AND '
                  '"released_at" IS NULL')

# --------------------------------------------------------------------------- delegations

DELEGATION_COLUMNS = ("delegation_id", "parent_id", "depth", "grant_json", "agent", "created_by_agent",
                      "created_by_user", "created_via", "created_at", "revoked_at", "revoked_by", "mac")
_D_COLUMNS = ", ".join(f'"d"."{c}"' for c in DELEGATION_COLUMNS)


def delegations_up(start: str) -> str:
    """The rows ``start`` (a condition on ``"d"``) selects and every ancestor of theirs, in creation
    order: a recursive walk up ``parent_id`` (UNION ends a cycle written around ctrlrun)."""
    return ('WITH RECURSIVE "up"("id") AS (SELECT CAST("d"."delegation_id" AS TEXT) FROM "ctrlrun_delegation" AS "d" '
            f'WHERE {start} UNION SELECT CAST("d"."parent_id" AS TEXT) FROM "ctrlrun_delegation" AS "d" JOIN "up" '
            f'ON "d"."delegation_id" = "up"."id") SELECT {_D_COLUMNS} FROM "ctrlrun_delegation" AS "d" WHERE '
            '"d"."delegation_id" IN (SELECT "id" FROM "up") ORDER BY "d"."created_at", "d"."delegation_id"')


#: The rows below the delegation %s: a recursive walk down ``parent_id``, through its index.
DELEGATIONS_DOWN = (
    'WITH RECURSIVE "down"("id") AS (SELECT CAST("d"."delegation_id" AS TEXT) FROM "ctrlrun_delegation" AS "d" '
    'WHERE "d"."parent_id" = %s UNION SELECT CAST("d"."delegation_id" AS TEXT) FROM "ctrlrun_delegation" AS "d" '
    f'JOIN "down" ON "d"."parent_id" = "down"."id") SELECT {_D_COLUMNS} FROM "ctrlrun_delegation" AS "d" WHERE '
    '"d"."delegation_id" IN (SELECT "id" FROM "down") ORDER BY "d"."created_at", "d"."delegation_id"')


def delegations_revoked(count: int, lock: str) -> str:
    """Whether each of ``count`` delegations is revoked, ``lock`` appended (the database's share lock)."""
    marks = ", ".join(["%s"] * count)
    return (f'SELECT "delegation_id", "revoked_at" FROM "ctrlrun_delegation" WHERE "delegation_id" IN ({marks}) '
            f'ORDER BY "delegation_id"{lock}')

#: executing -> executing: a suspended attempt (spec A5) keeps its key, its lease moved to the
#: suspension's end (never earlier) and its opening events gone into the chain (``pending`` emptied).
SUSPEND_HOLD = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "lease_expires_at" = %s, "pending" = NULL, "mac" = %s '
    'WHERE "effect_key" = %s AND "action_id" = %s AND "attempt" = %s AND "state" = %s')
