"""What the database itself refuses, whoever connects: ctrlrun's invariants as triggers.

- **Evidence is append-only.** Receipts, events, policy documents and the record of chain checks
  are never updated or deleted (nor truncated, on PostgreSQL). On SQLite an ``INSERT OR REPLACE`` / ``REPLACE`` deletes
  the row it collides with *without* firing DELETE triggers, so an insert that would collide with
  an existing row is refused before it happens (and an upsert's ``DO UPDATE`` is an update).
- **Effect records move only along the state table** (``states.TRANSITIONS``), in the style of
  django-pgtrigger's FSM trigger: a record is created ``executing`` at attempt 1; only the edges
  of the table are allowed; only ``failed -> executing`` hands the key to a new attempt (holder,
  action and attempt are fixed otherwise); a live holder's lease only moves later; the key never
  changes; ``committed`` is final; records are never deleted. An insert colliding with an
  existing key does nothing (ctrlrun's own reservation relies on that, and it makes SQLite's
  ``REPLACE`` harmless).
- **Approvals move pending -> granted | denied | expired, granted -> consumed | expired, and
  consumed -> granted** (given back by an attempt that provably did nothing) only with its signed
  ``returned`` count up by exactly one (every other change keeps it; a request starts at 0), so an
  older signed copy of a granted row cannot be written back over a later use; what the human read
  (the action, its hash, the principal, the expiry) never changes; never deleted.
- **Receipts are deleted only by a prune** (guard v9, the one scoped lift; docs/retention.md): inside the
  retention module's transaction, which opened the lock row with the next preimage of its hash chain
  (``ctrlrun.lift``), at or below a checkpoint, outside every live hold. Checkpoints are written only
  then; holds are placed once and released once; the lock row opens only that way and closes unchanged.
- **The chain head only moves forward**, is never deleted, and is the one row (id 1) of its table.
- **A paused run is never deleted, and what it resumes with never changes** (its request, framework,
  state, resumer, creation time and signature); only the claim bookkeeping moves.
- **Budget ledger rows are never deleted** (nor truncated, on PostgreSQL, nor replaced, on SQLite):
  a charge is given back only by setting its ``released_at`` (and its signature), once, and only
  while the effect record of its attempt is ``failed`` at that attempt: a committed charge is spent
  for good, whoever asks. Every other column is fixed and a release is never undone, so spend
  cannot be erased (or moved) to make room by rewriting a row either. A new row continues its
  (grant, metric)'s chain (its place ``n``, running total ``cum``, a ``consumed_at`` never earlier),
  so the running totals a budget check subtracts are the amounts' true sums.
- **Delegations are revoked once, never edited or deleted**: a row is inserted unrevoked, and its one
  allowed change sets ``revoked_at``, ``revoked_by`` (and its signature) on a row that had neither.
- **A mail delivery keeps who and why** (request, recipient, address, basis, link): it is inserted
  pending with no attempt, only a pending row changes (``attempts`` never goes down), never deleted.
- **A mail link's use is recorded once**: a link-use row is never changed, replaced or deleted, so a
  used link cannot be made usable again.

An application's usual database role (SELECT/INSERT/UPDATE/DELETE) cannot disable these: only
the tables' owner can. What a role *may* still write within the rules (a granted status, a
forged row at the head) is caught by the signatures in ``ctrlrun.signing``.

This module builds the newest version of the guard; what the database gets is always a frozen
version (``ctrlrun.guards``): each migration that installs the guard installs its own, with a record
of its number, and ``manage.py check`` says when the database's is missing or older
(``ctrlrun.W005``). A change here is a new version (``python -m ctrlrun.guards.freeze``), a migration
that installs it and ``guards.CURRENT`` moved on: ``tests/unit/test_guard_versions.py`` holds the
newest frozen version to what this module builds.

``install`` and ``remove`` take a connection: tooling that must empty the tables on purpose (a test
database's flush) lifts the guard and puts the newest version back.
"""
from __future__ import annotations

from typing import Any

from . import guards
from .states import (APPROVAL_GIVE_BACKS, APPROVAL_INITIAL, APPROVAL_TRANSITIONS, INITIAL_STATE, RENEWALS, TRANSITIONS,
                     EffectState as S)

__all__ = ["install", "remove", "APPEND_ONLY_MESSAGE"]

LEDGER_TABLE = "ctrlrun_budgetledger"
LEDGER_MESSAGE = "ctrlrun budget ledger rows are never deleted (a failed attempt releases its charge instead)"
LEDGER_RELEASE_MESSAGE = ("a ctrlrun budget ledger row only ever gets released_at, once, while the effect record of "
                          "its attempt is failed (what it charged, to whom and when never changes)")
APPEND_ONLY_MESSAGE = "ctrlrun evidence is append-only: receipts and events are never updated or deleted"
EVIDENCE_TABLES = ("ctrlrun_receipt", "ctrlrun_event", "ctrlrun_policydocument", "ctrlrun_chaincheck")
#: Columns an insert may collide on (primary key and unique columns), per evidence table.
_UNIQUE = {"ctrlrun_receipt": ("receipt_id", "seq"), "ctrlrun_event": ("id", "seq"),
           "ctrlrun_policydocument": ("hash",), "ctrlrun_chaincheck": ("id", "nonce")}
#: What the person deciding read; an approval keeps it for life.
_APPROVAL_FIXED = ("approval_id", "action", "action_id", "action_hash", "action_json", "agent", "user",
                   "effect_key", "policy_hash", "decision_reason", "created_at", "expires_at",
                   "precondition_fingerprint", "required_roles", "approvals_required")
#: The approval table's edges that keep the ``returned`` count (all but the give-backs).
_APPROVAL_EDGES = [edge for edge in APPROVAL_TRANSITIONS if edge not in APPROVAL_GIVE_BACKS]


def _edges(edges: Any) -> str:
    """``(OLD.<x>, NEW.<x>)`` is one of ``edges``, as plain comparisons grouped by source (a row-value
    ``IN (VALUES …)`` builds a temporary table on every row SQLite checks)."""
    by_source: dict[str, list[str]] = {}
    for source, target in sorted((str(a), str(b)) for a, b in edges):
        by_source.setdefault(source, []).append(target)
    return "(" + " OR ".join(
        f"(OLD.{{column}} = '{source}' AND NEW.{{column}} IN ({', '.join(repr(t) for t in targets)}))"
        for source, targets in by_source.items()) + ")"


def _effect_allowed() -> str:
    """The SQL condition an effect record UPDATE must meet. The holder, its action and the attempt
    change only when a retry renews a failed record; a live holder's lease only moves later (an
    older signed lease written back would let a live worker be swept)."""
    holding = (S.EXECUTING, S.EXECUTING)
    kept = [edge for edge in TRANSITIONS if edge not in RENEWALS and edge != holding and edge[0] is not S.NEW]
    same_holder = "NEW.attempt = OLD.attempt AND NEW.action_id = OLD.action_id AND NEW.action = OLD.action"
    return (
        "NEW.effect_key = OLD.effect_key AND NEW.created_at = OLD.created_at AND ("
        f"({_edges(kept).format(column='state')} AND {same_holder})"
        f" OR ({_edges([holding]).format(column='state')} AND {same_holder} "
        "AND NEW.lease_expires_at >= OLD.lease_expires_at)"
        f" OR ({_edges(RENEWALS).format(column='state')} AND NEW.attempt = OLD.attempt + 1))"
    )


def _same(column: str, distinct: str) -> str:
    return f'NEW."{column}" {distinct} OLD."{column}"'


def _approval_moves() -> str:
    """The approval table in words, by source: ``pending -> granted/denied/expired, ...``."""
    by_source: dict[str, list[str]] = {}
    for source, target in APPROVAL_TRANSITIONS:
        by_source.setdefault(source.value, []).append(target.value)
    return ", ".join(f"{source} -> {'/'.join(targets)}" for source, targets in by_source.items())


APPROVAL_MESSAGE = (f"ctrlrun approvals move {_approval_moves()} (given back, its returned count up by one; a "
                    "pending one may gain approvers short of its count), "
                    "and keep what the human read")


def _approval_allowed(same: str) -> str:
    fixed = " AND ".join(_same(c, same) for c in _APPROVAL_FIXED)
    edges = _edges(_APPROVAL_EDGES).format(column="status")
    given_back = (_edges(APPROVAL_GIVE_BACKS).format(column="status")
                  + ' AND NEW."returned" = OLD."returned" + 1')
    # M-of-N (policy v6): a verified approver short of the count is added to a request that stays pending.
    short = f"OLD.status = '{APPROVAL_INITIAL.value}' AND NEW.status = '{APPROVAL_INITIAL.value}'"
    return (f'{fixed} AND (({edges} AND NEW."returned" = OLD."returned") OR ({given_back}) '
            f'OR ({short} AND NEW."returned" = OLD."returned"))')


#: What a ledger row keeps for life; only released_at changes (with the row's signature), once.
_LEDGER_FIXED = ("id", "grant_id", "metric", "amount", "effect_key", "attempt", "consumed_at", "n", "cum")
LEDGER_CHAIN_MESSAGE = ("a ctrlrun budget ledger row continues its (grant, metric) chain: n one past the last row, "
                        "cum the last cum plus the amount, consumed_at no earlier than the last")
EFFECT_TABLE = "ctrlrun_effectrecord"


def _ledger_release_only(same: str) -> str:
    """A ledger UPDATE changes nothing, or releases an unreleased charge whose attempt's effect record
    is ``failed`` at that very attempt (NotExecuted, a hook's not_executed, a person's resolve
    --failed: the store moves the record first, in the same transaction)."""
    fixed = " AND ".join(_same(c, same) for c in _LEDGER_FIXED)
    failed = (f'EXISTS (SELECT 1 FROM "{EFFECT_TABLE}" WHERE "{EFFECT_TABLE}"."effect_key" = OLD."effect_key" '
              f'AND "{EFFECT_TABLE}"."attempt" = OLD."attempt" AND "{EFFECT_TABLE}"."state" = \'{S.FAILED.value}\')')
    unchanged = f'{_same("released_at", same)} AND {_same("mac", same)}'
    return (f'{fixed} AND (({unchanged}) OR (OLD."released_at" IS NULL AND NEW."released_at" IS NOT NULL '
            f'AND {failed}))')


def _ledger_chained() -> str:
    """A new ledger row continues its (grant_id, metric)'s chain: the first row (n 1) holds its own
    amount; any other is one past an existing row, its running total that row's plus its amount,
    consumed no earlier. A second row at one place is refused by ``ctrlrun_ledger_one_place``, so a
    chain has no gap, no fork and never goes back in time, and a budget's window is a prefix of it
    (docs/budgets.md). The predecessor is found by its place alone (the unique index: one row, however
    long the chain) and only then compared: a comparison on consumed_at in the lookup would let a
    cached plan range over the chain's index instead. SQLite's form (a unique index matched on every
    column is one row to it); PostgreSQL's is ``_pg_ledger_chained``."""
    return (f'(NEW."n" = 1 AND NEW."cum" = NEW."amount") OR COALESCE((SELECT NEW."cum" - "p"."cum" = NEW."amount" '
            f'AND NEW."consumed_at" >= "p"."consumed_at" FROM "{LEDGER_TABLE}" AS "p" WHERE "p"."grant_id" = '
            f'NEW."grant_id" AND "p"."metric" = NEW."metric" AND "p"."n" = NEW."n" - 1), FALSE)')


def _pg_ledger_chained() -> str:
    """``_ledger_chained`` as PostgreSQL plans it at a constant cost, statistics or none (guard v14).

    With no statistics (a server without autovacuum never analyses the ledger) the planner rates the
    chain index ``(grant, metric, consumed_at, cum)``, its rows filtered on ``n``, as cheap as the
    unique index of the places: equality on all three columns of the one or on two of the other are
    each estimated one row, and the tie went to the chain index, a walk of the whole chain on every
    insert. Here the predecessor is the last row at or before its place in the order of the places
    (``ctrlrun_ledger_one_place``, read backwards from ``(grant, metric, n - 1)``, one row): only
    that index yields the order, any other plan sorts every row the comparison leaves, so no estimate
    makes another plan cheaper. The row found is then checked to be that place of that chain."""
    return (f'(NEW."n" = 1 AND NEW."cum" = NEW."amount") OR COALESCE((SELECT "p"."grant_id" = NEW."grant_id" '
            f'AND "p"."metric" = NEW."metric" AND "p"."n" = NEW."n" - 1 AND NEW."cum" - "p"."cum" = NEW."amount" '
            f'AND NEW."consumed_at" >= "p"."consumed_at" FROM "{LEDGER_TABLE}" AS "p" WHERE ("p"."grant_id", '
            f'"p"."metric", "p"."n") <= (NEW."grant_id", NEW."metric", NEW."n" - 1) ORDER BY "p"."grant_id" DESC, '
            f'"p"."metric" DESC, "p"."n" DESC LIMIT 1), FALSE)')


#: What a delegation keeps for life; only revoked_at/revoked_by change, once.
_DELEGATION_FIXED = ("delegation_id", "parent_id", "depth", "grant_json", "agent", "created_by_agent",
                     "created_by_user", "created_via", "created_at")
DELEGATION_TABLE = "ctrlrun_delegation"


def _delegation_revoke_only(same: str) -> str:
    fixed = " AND ".join(_same(c, same) for c in _DELEGATION_FIXED)
    return (f'{fixed} AND OLD."revoked_at" IS NULL AND NEW."revoked_at" IS NOT NULL '
            f'AND NEW."revoked_by" IS NOT NULL')


_HEAD_FORWARD = "NEW.id = OLD.id AND NEW.seq >= OLD.seq AND NEW.event_seq >= OLD.event_seq"
HEAD_ONE_MESSAGE = "the ctrlrun chain head is the one row with id 1"
PAUSED_TABLE = "ctrlrun_pausedrun"
PAUSED_MESSAGE = ("a ctrlrun paused run is never deleted, and what it resumes with (request, framework, state, resumer) "
                  "never changes")
_PAUSED_FIXED = ("id", "approval_id", "framework", "state", "resume_with", "created_at", "mac")

CONTINUATION_TABLE = "ctrlrun_continuation"
CONTINUATION_MESSAGE = ("a ctrlrun continuation is never deleted and keeps its effect key (a suspension ends by its "
                        "one resume, or lapses)")


def _paused_fixed(same: str) -> str:
    return " AND ".join(_same(c, same) for c in _PAUSED_FIXED)
_INSERT_OK = f"NEW.state = '{INITIAL_STATE.value}' AND NEW.attempt = 1"

DELIVERY_TABLE, LINK_USE_TABLE = "ctrlrun_delivery", "ctrlrun_linkuse"
DELIVERY_MESSAGE = ("a ctrlrun mail delivery keeps its request, recipient, address, basis and link, starts pending "
                    "with no attempt, changes only while pending (attempts never go down) and is never deleted")
LINK_USE_MESSAGE = "the use of a ctrlrun mail link is recorded once: never changed, replaced or deleted"
_DELIVERY_FIXED = ("id", "approval_id", "recipient", "address", "basis", "created_at", "link_nonce")


def _delivery_moves(same: str) -> str:
    fixed = " AND ".join(_same(c, same) for c in _DELIVERY_FIXED)
    return f'{fixed} AND OLD."status" = \'pending\' AND NEW."attempts" >= OLD."attempts"'


_DELIVERY_INSERT_OK = 'NEW."status" = \'pending\' AND NEW."attempts" = 0'


# --------------------------------------------------------------------------- retention (the one scoped lift)
#: A receipt is deleted only inside the retention module's transaction (``store/retention.py``): the
#: lock row is open (only a transaction that revealed the next preimage of its hash chain can open it,
#: and nothing but that transaction sees it open), the receipt lies at or below a checkpoint, and no
#: live hold covers it. On PostgreSQL the transaction-local ``ctrlrun.retention`` must also name the
#: revealed preimage.
LOCK_TABLE, CHECKPOINT_TABLE, HOLD_TABLE = "ctrlrun_retentionlock", "ctrlrun_prunecheckpoint", "ctrlrun_hold"
LOCK_MESSAGE = ("the ctrlrun retention lock only opens with the next preimage of its chain, inside a prune, "
                "and closes unchanged")
CHECKPOINT_MESSAGE = "a ctrlrun prune checkpoint is written only inside a prune, forward, and never changed"
HOLD_MESSAGE = "a ctrlrun hold is placed once, unreleased, released once, and never deleted or edited"
_HOLD_FIXED = ("hold_id", "from_seq", "to_seq", "reason", "placed_by", "placed_at")


def _lock_open(vendor: str) -> str:
    if vendor == "sqlite":
        return f'(SELECT "open" FROM "{LOCK_TABLE}" WHERE "id" = 1) = 1'
    return (f'COALESCE((SELECT "open" AND "digest" = current_setting(\'ctrlrun.retention\', true) '
            f'FROM "{LOCK_TABLE}" WHERE "id" = 1), false)')


def _retention_lifted(vendor: str) -> str:
    """The condition under which a receipt's DELETE is the retention module's."""
    return (f'{_lock_open(vendor)} AND OLD."seq" IS NOT NULL '
            f'AND OLD."seq" <= (SELECT MAX("seq") FROM "{CHECKPOINT_TABLE}") '
            f'AND NOT EXISTS (SELECT 1 FROM "{HOLD_TABLE}" WHERE "released_at" IS NULL AND "from_seq" <= OLD."seq" '
            f'AND ("to_seq" IS NULL OR "to_seq" >= OLD."seq"))')


def _lock_moves(vendor: str) -> str:
    sha = ('ctrlrun_sha256(NEW."digest")' if vendor == "sqlite"
           else 'encode(sha256(convert_to(NEW."digest", \'UTF8\')), \'hex\')')
    yes, no = ("1", "0") if vendor == "sqlite" else ("true", "false")
    same = 'NEW."id" = OLD."id" AND NEW."key_id" = OLD."key_id"'
    return (f'{same} AND ((OLD."open" = {no} AND NEW."open" = {yes} AND {sha} = OLD."digest" '
            f'AND NEW."remaining" = OLD."remaining" - 1 AND OLD."remaining" > 0) '
            f'OR (OLD."open" = {yes} AND NEW."open" = {no} AND NEW."digest" = OLD."digest" '
            f'AND NEW."remaining" = OLD."remaining"))')


def _checkpoint_insert_ok(vendor: str) -> str:
    return f'{_lock_open(vendor)} AND NEW."seq" > COALESCE((SELECT MAX("seq") FROM "{CHECKPOINT_TABLE}"), 0)'


def _hold_release_once(same: str) -> str:
    fixed = " AND ".join(_same(c, same) for c in _HOLD_FIXED)
    return f'{fixed} AND OLD."released_at" IS NULL AND NEW."released_at" IS NOT NULL AND NEW."released_by" IS NOT NULL'


def _retention_sqlite(add: Any) -> None:
    add(f"{LOCK_TABLE}_no_insert", "BEFORE INSERT", LOCK_TABLE, LOCK_MESSAGE)
    add(f"{LOCK_TABLE}_no_delete", "BEFORE DELETE", LOCK_TABLE, LOCK_MESSAGE)
    add(f"{LOCK_TABLE}_moves", "BEFORE UPDATE", LOCK_TABLE, LOCK_MESSAGE, condition=f"NOT ({_lock_moves('sqlite')})")
    add(f"{CHECKPOINT_TABLE}_in_prune", "BEFORE INSERT", CHECKPOINT_TABLE, CHECKPOINT_MESSAGE,
        condition=f"NOT ({_checkpoint_insert_ok('sqlite')})")
    add(f"{CHECKPOINT_TABLE}_no_update", "BEFORE UPDATE", CHECKPOINT_TABLE, CHECKPOINT_MESSAGE)
    add(f"{CHECKPOINT_TABLE}_no_delete", "BEFORE DELETE", CHECKPOINT_TABLE, CHECKPOINT_MESSAGE)
    add(f"{HOLD_TABLE}_no_replace", "BEFORE INSERT", HOLD_TABLE, HOLD_MESSAGE,
        condition=f'NEW."released_at" IS NOT NULL OR NEW."released_by" IS NOT NULL OR EXISTS (SELECT 1 FROM '
                  f'"{HOLD_TABLE}" WHERE "hold_id" = NEW."hold_id")')
    add(f"{HOLD_TABLE}_no_delete", "BEFORE DELETE", HOLD_TABLE, HOLD_MESSAGE)
    add(f"{HOLD_TABLE}_release_once", "BEFORE UPDATE", HOLD_TABLE, HOLD_MESSAGE,
        condition=f"NOT ({_hold_release_once('IS')})")


def _retention_postgresql() -> list[str]:
    out = [
        _pg_function("ctrlrun_guard_receipt", "\n".join([
            f"IF TG_OP = 'DELETE' AND ({_retention_lifted('postgresql')}) THEN RETURN OLD; END IF;",
            _pg_raise(APPEND_ONLY_MESSAGE),
        ])),
        _pg_function("ctrlrun_guard_retentionlock", "\n".join([
            f"IF TG_OP = 'UPDATE' AND ({_lock_moves('postgresql')}) THEN RETURN NEW; END IF;",
            _pg_raise(LOCK_MESSAGE),
        ])),
        _pg_function("ctrlrun_guard_prunecheckpoint", "\n".join([
            f"IF TG_OP = 'INSERT' AND ({_checkpoint_insert_ok('postgresql')}) THEN RETURN NEW; END IF;",
            _pg_raise(CHECKPOINT_MESSAGE),
        ])),
        _pg_function("ctrlrun_guard_hold", "\n".join([
            "IF TG_OP = 'INSERT' THEN IF NEW.released_at IS NOT NULL OR NEW.released_by IS NOT NULL THEN "
            + _pg_raise(HOLD_MESSAGE) + " END IF; RETURN NEW; END IF;",
            f"IF TG_OP = 'UPDATE' AND ({_hold_release_once('IS NOT DISTINCT FROM')}) THEN RETURN NEW; END IF;",
            _pg_raise(HOLD_MESSAGE),
        ])),
    ]
    for table, function in ((LOCK_TABLE, "ctrlrun_guard_retentionlock"),
                            (CHECKPOINT_TABLE, "ctrlrun_guard_prunecheckpoint"), (HOLD_TABLE, "ctrlrun_guard_hold")):
        out += [
            f'CREATE TRIGGER "{table}_guard" BEFORE INSERT OR UPDATE OR DELETE ON "{table}" '
            f"FOR EACH ROW EXECUTE FUNCTION {function}()",
            f'CREATE TRIGGER "{table}_no_truncate" BEFORE TRUNCATE ON "{table}" '
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
        ]
    return out


# --------------------------------------------------------------------------- SQLite


def _sqlite_statements() -> list[tuple[str, str]]:
    """(trigger name, CREATE statement) pairs."""
    out: list[tuple[str, str]] = []

    def add(name: str, timing: str, table: str, message: str, *, condition: str | None = None,
            ignore: bool = False) -> None:
        action = "RAISE(IGNORE)" if ignore else f"RAISE(ABORT, '{message}')"
        clause = f" WHEN {condition}" if condition else ""
        out.append((name, f'CREATE TRIGGER "{name}" {timing} ON "{table}"{clause} BEGIN SELECT {action}; END'))

    for table in EVIDENCE_TABLES:
        add(f"{table}_no_update", "BEFORE UPDATE", table, APPEND_ONLY_MESSAGE)
        add(f"{table}_no_delete", "BEFORE DELETE", table, APPEND_ONLY_MESSAGE,
            condition=f"NOT ({_retention_lifted('sqlite')})" if table == "ctrlrun_receipt" else None)
        collide = " OR ".join(f'"{c}" = NEW."{c}"' for c in _UNIQUE[table])
        add(f"{table}_no_replace", "BEFORE INSERT", table,
            APPEND_ONLY_MESSAGE + " (an insert may not replace an existing row)",
            condition=f'EXISTS (SELECT 1 FROM "{table}" WHERE {collide})')

    effect = "ctrlrun_effectrecord"
    add(f"{effect}_no_replace", "BEFORE INSERT", effect, "", ignore=True,
        condition=f'EXISTS (SELECT 1 FROM "{effect}" WHERE "effect_key" = NEW."effect_key")')
    add(f"{effect}_insert_state", "BEFORE INSERT", effect,
        "a ctrlrun effect record starts executing at attempt 1", condition=f"NOT ({_INSERT_OK})")
    add(f"{effect}_no_delete", "BEFORE DELETE", effect, "ctrlrun effect records are never deleted")
    add(f"{effect}_state_table", "BEFORE UPDATE", effect,
        "ctrlrun effect records move only along the state table (committed is final)",
        condition=f"NOT ({_effect_allowed()})")

    approval = "ctrlrun_approval"
    add(f"{approval}_no_replace", "BEFORE INSERT", approval, "an approval request is created once, pending",
        condition=f'NEW."status" <> \'{APPROVAL_INITIAL.value}\' OR NEW."returned" <> 0 OR EXISTS (SELECT 1 FROM '
                  f'"{approval}" WHERE "approval_id" = NEW."approval_id")')
    add(f"{approval}_no_delete", "BEFORE DELETE", approval, "ctrlrun approvals are never deleted")
    add(f"{approval}_state_table", "BEFORE UPDATE", approval, APPROVAL_MESSAGE,
        condition=f"NOT ({_approval_allowed('IS')})")

    add(f"{LEDGER_TABLE}_no_delete", "BEFORE DELETE", LEDGER_TABLE, LEDGER_MESSAGE)
    add(f"{LEDGER_TABLE}_no_replace", "BEFORE INSERT", LEDGER_TABLE, LEDGER_MESSAGE,
        condition=f'EXISTS (SELECT 1 FROM "{LEDGER_TABLE}" WHERE "id" = NEW."id" OR ("effect_key" = '
                  f'NEW."effect_key" AND "attempt" = NEW."attempt" AND "grant_id" = NEW."grant_id" AND '
                  f'"metric" = NEW."metric") OR ("grant_id" = NEW."grant_id" AND "metric" = NEW."metric" AND '
                  f'"n" = NEW."n"))')
    add(f"{LEDGER_TABLE}_release_only", "BEFORE UPDATE", LEDGER_TABLE, LEDGER_RELEASE_MESSAGE,
        condition=f"NOT ({_ledger_release_only('IS')})")
    add(f"{LEDGER_TABLE}_chained", "BEFORE INSERT", LEDGER_TABLE, LEDGER_CHAIN_MESSAGE,
        condition=f"NOT ({_ledger_chained()})")
    table = DELEGATION_TABLE
    add(f"{table}_no_replace", "BEFORE INSERT", table, "a delegation is created once, unrevoked",
        condition=f'NEW."revoked_at" IS NOT NULL OR EXISTS (SELECT 1 FROM "{table}" WHERE '
                  f'"delegation_id" = NEW."delegation_id")')
    add(f"{table}_no_delete", "BEFORE DELETE", table, "ctrlrun delegations are never deleted")
    add(f"{table}_revoke_once", "BEFORE UPDATE", table,
        "a ctrlrun delegation is only ever revoked, once (there is no unrevoke)",
        condition=f"NOT ({_delegation_revoke_only('IS')})")

    add(f"{PAUSED_TABLE}_no_delete", "BEFORE DELETE", PAUSED_TABLE, PAUSED_MESSAGE)
    add(f"{PAUSED_TABLE}_fixed", "BEFORE UPDATE", PAUSED_TABLE, PAUSED_MESSAGE,
        condition=f"NOT ({_paused_fixed('IS')})")
    add(f"{PAUSED_TABLE}_no_replace", "BEFORE INSERT", PAUSED_TABLE, PAUSED_MESSAGE,
        condition=f'EXISTS (SELECT 1 FROM "{PAUSED_TABLE}" WHERE "id" = NEW."id" OR "approval_id" = '
                  f'NEW."approval_id")')

    add(f"{CONTINUATION_TABLE}_no_delete", "BEFORE DELETE", CONTINUATION_TABLE, CONTINUATION_MESSAGE)
    add(f"{CONTINUATION_TABLE}_key_fixed", "BEFORE UPDATE", CONTINUATION_TABLE, CONTINUATION_MESSAGE,
        condition='NEW."effect_key" <> OLD."effect_key"')
    add(f"{CONTINUATION_TABLE}_no_replace", "BEFORE INSERT", CONTINUATION_TABLE, CONTINUATION_MESSAGE,
        condition=f'EXISTS (SELECT 1 FROM "{CONTINUATION_TABLE}" WHERE "effect_key" = NEW."effect_key")')

    add(f"{DELIVERY_TABLE}_insert", "BEFORE INSERT", DELIVERY_TABLE, DELIVERY_MESSAGE,
        condition=f'NOT ({_DELIVERY_INSERT_OK}) OR EXISTS (SELECT 1 FROM "{DELIVERY_TABLE}" WHERE "id" = NEW."id" '
                  f'OR "link_nonce" = NEW."link_nonce" OR ("approval_id" = NEW."approval_id" AND "recipient" = '
                  f'NEW."recipient"))')
    add(f"{DELIVERY_TABLE}_no_delete", "BEFORE DELETE", DELIVERY_TABLE, DELIVERY_MESSAGE)
    add(f"{DELIVERY_TABLE}_moves", "BEFORE UPDATE", DELIVERY_TABLE, DELIVERY_MESSAGE,
        condition=f"NOT ({_delivery_moves('IS')})")
    add(f"{LINK_USE_TABLE}_no_update", "BEFORE UPDATE", LINK_USE_TABLE, LINK_USE_MESSAGE)
    add(f"{LINK_USE_TABLE}_no_delete", "BEFORE DELETE", LINK_USE_TABLE, LINK_USE_MESSAGE)
    add(f"{LINK_USE_TABLE}_no_replace", "BEFORE INSERT", LINK_USE_TABLE, LINK_USE_MESSAGE,
        condition=f'EXISTS (SELECT 1 FROM "{LINK_USE_TABLE}" WHERE "nonce" = NEW."nonce")')

    head = "ctrlrun_chainhead"
    add(f"{head}_no_replace", "BEFORE INSERT", head, "", ignore=True,
        condition=f'EXISTS (SELECT 1 FROM "{head}" WHERE "id" = NEW."id")')
    add(f"{head}_only_one", "BEFORE INSERT", head, HEAD_ONE_MESSAGE, condition='NEW."id" <> 1')
    add(f"{head}_no_delete", "BEFORE DELETE", head, "the ctrlrun chain head is never deleted")
    add(f"{head}_forward", "BEFORE UPDATE", head, "the ctrlrun chain head only moves forward",
        condition=f"NOT ({_HEAD_FORWARD})")
    _retention_sqlite(add)
    return out


# --------------------------------------------------------------------------- PostgreSQL


def _pg_function(name: str, body: str) -> str:
    return (f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$\nBEGIN\n{body}\nEND\n$$ LANGUAGE plpgsql")


def _pg_raise(message: str) -> str:
    return f"RAISE EXCEPTION '{message} (% on %)', TG_OP, TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';"


def _postgresql_statements() -> list[str]:
    statements = [
        _pg_function("ctrlrun_refuse_evidence_change", _pg_raise(APPEND_ONLY_MESSAGE)),
        _pg_function("ctrlrun_guard_effectrecord", "\n".join([
            "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise("ctrlrun effect records are never deleted") + " END IF;",
            f"IF TG_OP = 'INSERT' THEN IF NOT ({_INSERT_OK}) THEN "
            + _pg_raise("a ctrlrun effect record starts executing at attempt 1") + " END IF; RETURN NEW; END IF;",
            f"IF NOT ({_effect_allowed()}) THEN "
            "RAISE EXCEPTION 'ctrlrun effect records move only along the state table (committed is final): "
            "% -> % refused for %', OLD.state, NEW.state, OLD.effect_key USING ERRCODE = 'insufficient_privilege'; "
            "END IF;",
            "RETURN NEW;",
        ])),
        _pg_function("ctrlrun_guard_approval", "\n".join([
            "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise("ctrlrun approvals are never deleted") + " END IF;",
            f"IF TG_OP = 'INSERT' THEN IF NEW.status <> '{APPROVAL_INITIAL.value}'"
            + " OR NEW.returned <> 0 THEN "
            + _pg_raise("an approval request is created pending") + " END IF; RETURN NEW; END IF;",
            f"IF NOT ({_approval_allowed('IS NOT DISTINCT FROM')}) THEN "
            + _pg_raise(APPROVAL_MESSAGE) + " END IF;",
            "RETURN NEW;",
        ])),
        _pg_function("ctrlrun_guard_chainhead", "\n".join([
            "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise("the ctrlrun chain head is never deleted") + " END IF;",
            "IF TG_OP = 'INSERT' THEN IF NEW.id <> 1 THEN " + _pg_raise(HEAD_ONE_MESSAGE) + " END IF; RETURN NEW; END IF;",
            f"IF TG_OP = 'UPDATE' AND NOT ({_HEAD_FORWARD}) THEN "
            + _pg_raise("the ctrlrun chain head only moves forward") + " END IF;",
            "RETURN NEW;",
        ])),
        _pg_function("ctrlrun_guard_budgetledger", "\n".join([
            "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise(LEDGER_MESSAGE) + " END IF;",
            f"IF TG_OP = 'INSERT' THEN IF NOT ({_pg_ledger_chained()}) THEN " + _pg_raise(LEDGER_CHAIN_MESSAGE)
            + " END IF; RETURN NEW; END IF;",
            f"IF NOT ({_ledger_release_only('IS NOT DISTINCT FROM')}) THEN "
            + _pg_raise(LEDGER_RELEASE_MESSAGE) + " END IF;",
            "RETURN NEW;",
        ])),
    ]
    statements += [
        f'CREATE TRIGGER "{LEDGER_TABLE}_guard" BEFORE INSERT OR UPDATE OR DELETE ON "{LEDGER_TABLE}" '
        "FOR EACH ROW EXECUTE FUNCTION ctrlrun_guard_budgetledger()",
        f'CREATE TRIGGER "{LEDGER_TABLE}_no_truncate" BEFORE TRUNCATE ON "{LEDGER_TABLE}" '
        "FOR EACH STATEMENT EXECUTE FUNCTION ctrlrun_guard_budgetledger()",
    ]
    statements.append(_pg_function("ctrlrun_guard_pausedrun", "\n".join([
        "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise(PAUSED_MESSAGE) + " END IF;",
        f"IF NOT ({_paused_fixed('IS NOT DISTINCT FROM')}) THEN " + _pg_raise(PAUSED_MESSAGE) + " END IF;",
        "RETURN NEW;",
    ])))
    statements += [
        f'CREATE TRIGGER "{PAUSED_TABLE}_guard" BEFORE UPDATE OR DELETE ON "{PAUSED_TABLE}" '
        f"FOR EACH ROW EXECUTE FUNCTION ctrlrun_guard_pausedrun()",
        f'CREATE TRIGGER "{PAUSED_TABLE}_no_truncate" BEFORE TRUNCATE ON "{PAUSED_TABLE}" '
        f"FOR EACH STATEMENT EXECUTE FUNCTION ctrlrun_guard_pausedrun()",
    ]
    statements.append(_pg_function("ctrlrun_guard_continuation", "\n".join([
        "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise(CONTINUATION_MESSAGE) + " END IF;",
        'IF NEW."effect_key" <> OLD."effect_key" THEN ' + _pg_raise(CONTINUATION_MESSAGE) + " END IF;",
        "RETURN NEW;",
    ])))
    statements += [
        f'CREATE TRIGGER "{CONTINUATION_TABLE}_guard" BEFORE UPDATE OR DELETE ON "{CONTINUATION_TABLE}" '
        f"FOR EACH ROW EXECUTE FUNCTION ctrlrun_guard_continuation()",
        f'CREATE TRIGGER "{CONTINUATION_TABLE}_no_truncate" BEFORE TRUNCATE ON "{CONTINUATION_TABLE}" '
        f"FOR EACH STATEMENT EXECUTE FUNCTION ctrlrun_guard_continuation()",
    ]
    statements.append(_pg_function("ctrlrun_guard_delegation", "\n".join([
        "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise("ctrlrun delegations are never deleted") + " END IF;",
        "IF TG_OP = 'INSERT' THEN IF NEW.revoked_at IS NOT NULL THEN "
        + _pg_raise("a delegation is created unrevoked") + " END IF; RETURN NEW; END IF;",
        f"IF NOT ({_delegation_revoke_only('IS NOT DISTINCT FROM')}) THEN "
        + _pg_raise("a ctrlrun delegation is only ever revoked, once (there is no unrevoke)") + " END IF;",
        "RETURN NEW;",
    ])))
    statements += [
        f'CREATE TRIGGER "{DELEGATION_TABLE}_guard" BEFORE INSERT OR UPDATE OR DELETE ON "{DELEGATION_TABLE}" '
        f"FOR EACH ROW EXECUTE FUNCTION ctrlrun_guard_delegation()",
        f'CREATE TRIGGER "{DELEGATION_TABLE}_no_truncate" BEFORE TRUNCATE ON "{DELEGATION_TABLE}" '
        f"FOR EACH STATEMENT EXECUTE FUNCTION ctrlrun_guard_delegation()",
    ]
    statements.append(_pg_function("ctrlrun_guard_delivery", "\n".join([
        "IF TG_OP IN ('DELETE', 'TRUNCATE') THEN " + _pg_raise(DELIVERY_MESSAGE) + " END IF;",
        f"IF TG_OP = 'INSERT' THEN IF NOT ({_DELIVERY_INSERT_OK}) THEN " + _pg_raise(DELIVERY_MESSAGE)
        + " END IF; RETURN NEW; END IF;",
        f"IF NOT ({_delivery_moves('IS NOT DISTINCT FROM')}) THEN " + _pg_raise(DELIVERY_MESSAGE) + " END IF;",
        "RETURN NEW;",
    ])))
    statements.append(_pg_function("ctrlrun_guard_linkuse", _pg_raise(LINK_USE_MESSAGE)))
    for table, function, ops in ((DELIVERY_TABLE, "ctrlrun_guard_delivery", "INSERT OR UPDATE OR DELETE"),
                                 (LINK_USE_TABLE, "ctrlrun_guard_linkuse", "UPDATE OR DELETE")):
        statements += [
            f'CREATE TRIGGER "{table}_guard" BEFORE {ops} ON "{table}" FOR EACH ROW EXECUTE FUNCTION {function}()',
            f'CREATE TRIGGER "{table}_no_truncate" BEFORE TRUNCATE ON "{table}" '
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
        ]

    statements += _retention_postgresql()
    for table in EVIDENCE_TABLES:
        refuse = "ctrlrun_guard_receipt" if table == "ctrlrun_receipt" else "ctrlrun_refuse_evidence_change"
        statements += [
            f'CREATE TRIGGER "{table}_append_only" BEFORE UPDATE OR DELETE ON "{table}" '
            f"FOR EACH ROW EXECUTE FUNCTION {refuse}()",
            f'CREATE TRIGGER "{table}_no_truncate" BEFORE TRUNCATE ON "{table}" '
            f"FOR EACH STATEMENT EXECUTE FUNCTION ctrlrun_refuse_evidence_change()",
        ]
    for table, function, ops in (("ctrlrun_effectrecord", "ctrlrun_guard_effectrecord", "INSERT OR UPDATE OR DELETE"),
                                 ("ctrlrun_approval", "ctrlrun_guard_approval", "INSERT OR UPDATE OR DELETE"),
                                 ("ctrlrun_chainhead", "ctrlrun_guard_chainhead", "INSERT OR UPDATE OR DELETE")):
        statements += [
            f'CREATE TRIGGER "{table}_guard" BEFORE {ops} ON "{table}" FOR EACH ROW EXECUTE FUNCTION {function}()',
            f'CREATE TRIGGER "{table}_no_truncate" BEFORE TRUNCATE ON "{table}" '
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
        ]
    return statements


def install(connection: Any) -> None:
    """Put the newest guard in place (``guards.CURRENT``, frozen from what this module builds), with its
    version record, replacing whatever version was there (a test database's flush puts it back)."""
    from .lift import seed_lock

    seed_lock(connection)  # before the guard: once it is in place, nothing inserts the lock row
    guards.install(connection, guards.CURRENT)


def remove(connection: Any) -> None:
    """Lift the guard, whichever version is installed (a test database's flush; never in production)."""
    guards.remove(connection)
