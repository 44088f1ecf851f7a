"""The rows ctrlrun keeps, and why each looks the way it does.

- ``EffectRecord``: one row per effect key (``refund:txn_9``), the primary key itself. The
  database's uniqueness on that key is the last guard against a double execution: two
  reservations of one key can never both insert. ``state`` walks the table in ``states.py``;
  ``attempt`` counts reservations (a retry after ``failed`` renews the row with attempt + 1);
  ``lease_expires_at`` is set exactly while a worker holds the row (reserved/executing), a
  check constraint says so.
- ``Event``: the fine-grained story of every call, append-only, hash-chained like receipts
  through ``seq``/``prev_hash``/``hash`` (its own chain, under the same head row). A running
  call's opening events wait on its effect record (``pending``) and join the chain when the call
  ends or its lease is swept, so reserving a key takes no global lock.
- ``Receipt``: one per finished or refused call, a ``ctrlrun.receipt/v7`` JSON document kept
  byte for byte as written (a text column: PostgreSQL's jsonb would reorder keys), hash-chained
  through ``seq``/``prev_hash``/``hash``.
- ``ChainHead``: a single row holding the last receipt's and the last event's ``seq`` and
  ``hash``, signed (``mac``) with a key kept outside the database (``ctrlrun.signing``) whose id it
  records. Every evidence append locks it, which keeps both chains linear on any host.
- ``mac`` on effect records, approvals, delegations, budget charges, policy documents, chain
  checks and paused runs: the store's signature of the row's identity and every column a decision
  or a page reads (``store/signatures.py``), so a row written around ctrlrun is refused where it is
  used and named by ``receipts --verify-chain`` (docs/guarantees.md has the table-by-table matrix).
- ``Approval``: a human's answer to an ``approve`` decision, bound to the action hash of the
  exact call the human read (``action_json`` keeps that call whole). It moves pending ->
  granted | denied | expired, and granted -> consumed (once) | expired; only the store moves it.
- ``ChainCheck``: one row per verification of the evidence (``receipts --verify-chain``, the
  console's button): when (the store's clock), full or incremental, the receipt and event
  positions and hashes it verified up to, the result. Append-only and signed like the evidence,
  so an incremental check can start from the last intact one, and the front page can show the
  last result without re-hashing anything.
- ``BudgetLedger``: one row per budget charge of an attempt (authority), written with the
  reservation, released (``released_at``) when the attempt ends failed (the database allows it only
  then), never deleted.
- ``Delegation``: a grant handed down at runtime, revoked once, never deleted; read per call by
  its ``agent`` (indexed) and the ancestors of those rows, never all of them.
- ``PausedRun``: an agent framework's run paused on an approval (app data; what it resumes with is
  signed and fixed).
- ``PolicyDocument``: every policy text that decided an action, by hash, so a receipt's
  ``policy_hash`` can always be traced back to the exact rules that applied.

Only ``store.py`` reads or writes these models.
"""
from __future__ import annotations

import json

from django.db import models
from django.db.models import Q

from .canonical import GENESIS_HASH, MAX_KEY_LENGTH
from .states import ApprovalStatus, EffectState, EventType, Result

_STORED_STATES = [(s.value, s.value) for s in EffectState if s is not EffectState.NEW]
_HOLDING = [EffectState.RESERVED.value, EffectState.EXECUTING.value]
ID_LENGTH = 36  # "act_" + 32 hex characters
HASH_LENGTH = 71  # "sha256:" + 64 hex characters
MAC_LENGTH = 76  # "hmac-sha256:" + 64 hex characters


class JSONTextField(models.TextField):
    """JSON kept as text, in the order it was written.

    Event data is read by people (``inspect``, the console) in the order the kernel wrote it;
    PostgreSQL's jsonb would reorder keys, so the same event would print differently on SQLite
    and PostgreSQL. Nobody queries inside event data, so text loses nothing.
    """

    def from_db_value(self, value: str | None, expression: object, connection: object) -> object:
        if value is None:
            return None
        try:
            return json.loads(value)
        except ValueError:  # a row altered around ctrlrun: shown for what it is (verification names it)
            return {"unreadable": value}

    def to_python(self, value: object) -> object:
        return json.loads(value) if isinstance(value, str) else value

    def get_prep_value(self, value: object) -> str | None:
        return None if value is None else dumps_json(value)


#: One encoder, built once: json.dumps with non-default options builds a new one per call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps_json(value: object) -> str:
    return _COMPACT.encode(value)


class PolicyDocument(models.Model):
    hash = models.CharField(primary_key=True, max_length=HASH_LENGTH)
    schema = models.CharField(max_length=40)
    # The admin shows help text as HTML: written so that nothing in it reads as a tag.
    source = models.TextField(help_text="Where the text was read from: a file's path, or &lt;string&gt; "
                                        "for text given directly.")
    text = models.TextField()
    environment = models.CharField(max_length=100)
    first_seen = models.DateTimeField()
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the hash, the text and where it came from.")

    class Meta:
        ordering = ["-first_seen"]

    def __str__(self) -> str:
        return f"{self.hash[:19]}… from {self.source}"


class EffectRecord(models.Model):
    effect_key = models.CharField(primary_key=True, max_length=MAX_KEY_LENGTH)
    action = models.CharField(max_length=200, help_text="The protected action that holds the key.")
    state = models.CharField(max_length=12, choices=_STORED_STATES)
    action_id = models.CharField(max_length=ID_LENGTH, help_text="The attempt that holds (or held) the key.")
    attempt = models.PositiveIntegerField(default=1)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    result_json = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, null=True, blank=True)
    reconcile_failures = models.PositiveIntegerField(
        default=0, help_text="How many times in a row the reconcile hook could not say."
    )
    reconcile_after = models.DateTimeField(
        null=True, blank=True, help_text="Deferred reconciliation leaves the record alone until then."
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    pending = models.TextField(
        null=True, blank=True,
        help_text="The running attempt's opening events, until they join the event chain when it ends.",
    )
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the state, holder, attempt, lease and resolver.")

    class Meta:
        permissions = [("resolve_effect", "Can resolve ambiguous effects and ask the remote")]
        indexes = [models.Index(fields=["state", "updated_at"], name="ctrlrun_effect_state_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=_HOLDING, lease_expires_at__isnull=False)
                | (~Q(state__in=_HOLDING) & Q(lease_expires_at__isnull=True)),
                name="ctrlrun_effect_lease_iff_held",
            ),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="ctrlrun_effect_attempt_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.effect_key} ({self.state}, attempt {self.attempt})"


class Event(models.Model):
    id = models.BigAutoField(primary_key=True)
    ts = models.DateTimeField()
    type = models.CharField(max_length=40, choices=[(t.value, t.value) for t in EventType])
    action_id = models.CharField(max_length=ID_LENGTH, null=True, blank=True, db_index=True)
    effect_key = models.CharField(max_length=MAX_KEY_LENGTH, null=True, blank=True, db_index=True)
    approval_id = models.CharField(max_length=ID_LENGTH, null=True, blank=True)
    data = JSONTextField(default=dict)
    # Unique, as for receipts: a forged row can never share a place in the chain with a real one,
    # and a reservation can cheaply see whether anything lies past the head.
    seq = models.BigIntegerField(unique=True, null=True, help_text="Position in the event chain.")
    prev_hash = models.CharField(max_length=HASH_LENGTH, null=True)
    hash = models.CharField(max_length=HASH_LENGTH, null=True)

    class Meta:
        ordering = ["id"]
        # Partial: most events name no approval, and cost this index nothing. An incremental chain
        # check reads the whole story of the approvals it checks through it.
        indexes = [models.Index(fields=["approval_id"], condition=Q(approval_id__isnull=False),
                                name="ctrlrun_event_approval_idx")]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class Receipt(models.Model):
    receipt_id = models.CharField(primary_key=True, max_length=ID_LENGTH)
    seq = models.BigIntegerField(unique=True, null=True)
    action_id = models.CharField(max_length=ID_LENGTH, db_index=True)
    action = models.CharField(max_length=200)
    agent = models.CharField(max_length=200)
    decision = models.CharField(max_length=10)
    result = models.CharField(max_length=12, choices=[(r.value, r.value) for r in Result])
    effect_key = models.CharField(max_length=MAX_KEY_LENGTH, null=True, blank=True, db_index=True)
    ts = models.DateTimeField(help_text="When the receipt was written (its finished_at).")
    document = models.TextField(help_text="The ctrlrun.receipt/v7 JSON, byte for byte as hashed.")
    prev_hash = models.CharField(max_length=HASH_LENGTH, null=True)
    hash = models.CharField(max_length=HASH_LENGTH, null=True)

    class Meta:
        ordering = ["seq"]
        # 'stats --since' and the front page's last 24 hours read a window of receipts by time.
        indexes = [models.Index(fields=["ts"], name="ctrlrun_receipt_ts_idx")]
        permissions = [("run_verify", "Can grade the deployment (verify) in the console")]

    def __str__(self) -> str:
        return f"{self.receipt_id} {self.action} {self.result}"


class ChainHead(models.Model):
    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=HASH_LENGTH, default=GENESIS_HASH)
    event_seq = models.BigIntegerField(default=0)
    event_hash = models.CharField(max_length=HASH_LENGTH, default=GENESIS_HASH)
    mac = models.CharField(max_length=MAC_LENGTH, null=True)
    key_id = models.CharField(max_length=32, null=True, help_text="The id of the key that signs this store.")

    def __str__(self) -> str:
        return f"chain head at seq {self.seq}"


class Approval(models.Model):
    approval_id = models.CharField(primary_key=True, max_length=ID_LENGTH)
    status = models.CharField(max_length=10, choices=[(s.value, s.value) for s in ApprovalStatus])
    action = models.CharField(max_length=200)
    action_id = models.CharField(max_length=ID_LENGTH, help_text="The call that asked.")
    action_hash = models.CharField(max_length=HASH_LENGTH, db_index=True)
    action_json = models.TextField(help_text="The whole canonical action the human is asked about.")
    agent = models.CharField(max_length=200)
    user = models.CharField(max_length=200, null=True, blank=True)
    effect_key = models.CharField(max_length=MAX_KEY_LENGTH, null=True, blank=True)
    policy_hash = models.CharField(max_length=HASH_LENGTH, null=True)
    decision_reason = models.CharField(max_length=100)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    approver = models.CharField(max_length=200, null=True, blank=True)
    note = models.TextField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.CharField(max_length=ID_LENGTH, null=True, blank=True,
                                   help_text="The call that used the approval.")
    returned = models.PositiveIntegerField(
        default=0, help_text="How many times an attempt that provably did nothing gave it back (signed; only grows).")
    precondition_fingerprint = models.CharField(
        max_length=HASH_LENGTH, null=True, blank=True,
        help_text="The fingerprint of the state the person approving saw (preconditions; signed, fixed).")
    required_roles = models.TextField(
        default="[]", help_text="The roles the request pins, JSON [{control, role}] (policy v6 approver_role; signed).")
    approvals_required = models.PositiveIntegerField(
        default=1, help_text="How many distinct verified people must grant it (policy v6; signed).")
    approvers = models.TextField(
        default="[]", help_text="The verified approvers so far, JSON [{agent, user, issuer, entitled, granted_at}] "
                                "(signed).")
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the request, its answer and its use.")

    class Meta:
        ordering = ["created_at"]
        permissions = [("decide_approval", "Can approve or deny approval requests")]
        indexes = [models.Index(fields=["status", "created_at"], name="ctrlrun_approval_status_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(status="pending") | Q(status="expired", approver__isnull=True) | Q(approver__isnull=False),
                name="ctrlrun_approval_answered_by_someone",
            ),
            models.CheckConstraint(
                condition=~Q(status="consumed") | Q(consumed_at__isnull=False, consumed_by__isnull=False),
                name="ctrlrun_approval_consumed_by_a_call",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.approval_id} {self.action} ({self.status})"


class ChainCheck(models.Model):
    FULL, INCREMENTAL = "full", "incremental"

    id = models.BigAutoField(primary_key=True)
    # Unique and signed: a recorded check copied under a new id either keeps its nonce (refused) or
    # takes another (and no longer verifies).
    nonce = models.CharField(max_length=ID_LENGTH, unique=True, null=True,
                             help_text="The check's own identity, under its signature.")
    checked_at = models.DateTimeField(help_text="When the check started (the store's clock).")
    mode = models.CharField(max_length=12, choices=[(FULL, FULL), (INCREMENTAL, INCREMENTAL)])
    from_receipt_seq = models.BigIntegerField(default=0, help_text="The receipt seq it started after (0: all).")
    receipt_seq = models.BigIntegerField(help_text="The receipt seq it verified up to (the head's).")
    receipt_hash = models.CharField(max_length=HASH_LENGTH)
    from_event_seq = models.BigIntegerField(default=0)
    event_seq = models.BigIntegerField()
    event_hash = models.CharField(max_length=HASH_LENGTH)
    ok = models.BooleanField()
    breaks = models.PositiveIntegerField(default=0)
    receipts_checked = models.BigIntegerField(default=0)
    events_checked = models.BigIntegerField(default=0)
    signatures_checked = models.BigIntegerField(default=0)
    summary = models.TextField(help_text="The verdict, and the first breaks found.")
    duration_seconds = models.FloatField()
    ran_by = models.CharField(max_length=200, help_text="Who or what ran it.")
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the result and the positions.")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["ok", "id"], name="ctrlrun_chaincheck_ok_idx")]

    def __str__(self) -> str:
        return f"{self.mode} check {self.id} ({'intact' if self.ok else 'broken'})"


class PausedRun(models.Model):
    """An agent framework's run, paused on a ctrlrun approval request, kept until it is resumed.

    Mutable application data, not evidence (no chain, no signature, not append-only): nothing here
    is trusted for consent. The resumed tool call still needs ctrlrun's grant for its exact action
    hash, which the adapters check where the effect happens; a ``state`` edited to run something
    else is refused there. ``status`` moves pending -> resuming (one process claims the row, with a
    conditional UPDATE) -> resumed | failed, and never back by itself. A person may release a claim
    older than ``CTRLRUN_RESUME_RELEASE_AFTER_SECONDS`` (its process died): resuming -> pending, with
    who, when and why recorded (``resume_runs --release``).
    """

    PENDING, RESUMING, RESUMED, FAILED = "pending", "resuming", "resumed", "failed"
    STATUSES = (PENDING, RESUMING, RESUMED, FAILED)
    FRAMEWORKS = ("openai-agents", "langgraph", "pydantic-ai")

    id = models.BigAutoField(primary_key=True)
    approval_id = models.CharField(max_length=ID_LENGTH, unique=True,
                                   help_text="The ctrlrun approval request the run waits on.")
    framework = models.CharField(max_length=20, choices=[(f, f) for f in FRAMEWORKS])
    state = models.TextField(help_text="The framework's paused run as JSON text (RunState JSON; a LangGraph "
                                       "thread id and checkpoint namespace; Pydantic AI's messages and "
                                       "deferred calls).")
    resume_with = models.CharField(max_length=200, help_text="The registered resumer that continues the run.")
    status = models.CharField(max_length=10, choices=[(s, s) for s in STATUSES], default=PENDING)
    answer = models.CharField(max_length=10, null=True, blank=True,
                              help_text="What the resumer was told: granted, denied or expired.")
    claimed_by = models.CharField(max_length=200, null=True, blank=True,
                                  help_text="The process that resumed the run (host:pid).")
    created_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True, help_text="When the resumer finished.")
    error = models.TextField(null=True, blank=True, help_text="Why the resume failed.")
    released_by = models.CharField(max_length=200, null=True, blank=True,
                                   help_text="Who released the run's last claim (resume_runs --release).")
    released_at = models.DateTimeField(null=True, blank=True, help_text="When its last claim was released.")
    release_reason = models.TextField(null=True, blank=True, help_text="Why its last claim was released.")
    released_claim = models.CharField(max_length=300, null=True, blank=True,
                                      help_text="The claim that was released: the process (host:pid) and when it "
                                                "claimed the run.")
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the request, framework, state and resumer.")

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["status", "created_at"], name="ctrlrun_pausedrun_status_idx")]

    def __str__(self) -> str:
        return f"{self.framework} run paused on {self.approval_id} ({self.status})"


class BudgetLedger(models.Model):
    """One budget charge of one attempt: what a call spent of a grant's budget (authority, §C5).

    Written in the transaction that takes the call's effect key, one row per budget per grant (the
    deciding grant and each of its ancestors). Spent, for a budget, is the sum of the rows of its
    (grant_id, metric) that are not released, consumed inside its window. When the attempt ends
    ``failed`` (the function raised NotExecuted, a hook said ``not_executed``, a person resolved it
    failed) its rows get ``released_at``, in the transaction that moves the record; an ambiguous or
    running attempt holds its charge, a committed one keeps it for good.

    Mutable (``released_at`` is set once) but never deleted: the database refuses deletes
    (``ctrlrun.guard``), so spend cannot be erased to make room.

    Each (grant_id, metric)'s rows form a chain: ``n`` counts them (1, 2, ...), ``cum`` is the running
    total of their amounts (released ones included) and ``consumed_at`` never goes back along it, so
    what a window holds is two index seeks, whatever the ledger's size (docs/budgets.md). The
    database refuses a row that does not continue its chain.
    """

    id = models.BigAutoField(primary_key=True)
    grant_id = models.CharField(max_length=200, help_text="The grant whose budget this charge spends.")
    metric = models.CharField(max_length=200, help_text="'count', or the name of the argument whose value is summed.")
    amount = models.BigIntegerField(help_text="What the call spent (>= 0).")
    effect_key = models.CharField(max_length=MAX_KEY_LENGTH, help_text="The effect key the call took.")
    attempt = models.PositiveIntegerField(help_text="The attempt of that key that made the charge.")
    consumed_at = models.DateTimeField(help_text="When the charge was made (the store's clock).")
    released_at = models.DateTimeField(null=True, blank=True,
                                       help_text="When the attempt ended failed and the charge was given back.")
    n = models.BigIntegerField(help_text="This row's place in its (grant_id, metric)'s chain: 1, 2, ...")
    cum = models.BigIntegerField(help_text="The running total of the chain's amounts up to this row, released "
                                           "ones included.")
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the charge and its release.")

    class Meta:
        ordering = ["id"]
        indexes = [
            # A budget check's two seeks: the running total at the chain's end and before the window
            # (consumed_at and cum never go back along n, so the largest cum at or before a time is the
            # cum of the last row then); the console's usage reads the window through it. Without n,
            # so the guard's lookup of a row's predecessor by its place has one index to take.
            models.Index(fields=["grant_id", "metric", "consumed_at", "cum"], name="ctrlrun_ledger_chain_idx"),
            # The released charges of a window, subtracted from the running totals' difference: an
            # index holding exactly the released rows.
            models.Index(fields=["grant_id", "metric", "consumed_at"], name="ctrlrun_ledger_released_idx",
                         condition=models.Q(released_at__isnull=False)),
            # An attempt's charges (a release, the effects command) are read through the unique index of
            # ctrlrun_ledger_one_charge below, whose leading columns are (effect_key, attempt).
        ]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=0), name="ctrlrun_ledger_amount_nonneg"),
            # A charge's identity (what its signature covers): a copy of a row is refused.
            models.UniqueConstraint(fields=["effect_key", "attempt", "grant_id", "metric"],
                                    name="ctrlrun_ledger_one_charge"),
            # One row per place in a chain: the database's chain check reads the predecessor through it.
            models.UniqueConstraint(fields=["grant_id", "metric", "n"], name="ctrlrun_ledger_one_place"),
        ]

    def __str__(self) -> str:
        released = ", released" if self.released_at else ""
        return f"{self.amount} {self.metric} on {self.grant_id} by {self.effect_key} (attempt {self.attempt}{released})"


class Delegation(models.Model):
    """A grant handed down at runtime (``Control.delegate`` / ``ctrlrun delegate``) from a delegable
    grant of the policy's ``authority:`` section, or from another delegation.

    Evidence-like: never deleted, and ``revoked_at`` / ``revoked_by`` are set once, never cleared
    (``store.revoke_delegation``; the database refuses any other change and every DELETE). The
    chain above a delegation is walked again on every evaluation, so revoking one cuts every
    delegation beneath it from the next call on. ``grant_json`` is the grant's sorted canonical
    JSON, read back and validated each time: a row that cannot be read (or a ``created_via``
    outside the closed set) refuses every action (``authority_unreadable``).
    """

    VIA = ("api", "cli", "break-glass", "hop")

    delegation_id = models.CharField(primary_key=True, max_length=ID_LENGTH, help_text="dlg_ and 32 hex digits.")
    parent_id = models.CharField(max_length=200, db_index=True,
                                 help_text="The grant (policy id) or delegation (dlg_...) it was delegated from.")
    depth = models.PositiveIntegerField(help_text="Steps below its root grant: 1 for a grant's direct delegation.")
    grant_json = models.TextField(help_text="The delegated grant: its sorted canonical JSON, without id.")
    # The grant's subject agent (always one literal agent): a call reads the delegations of its own
    # agent through this index, never the whole table.
    agent = models.CharField(max_length=200, null=True, blank=True,
                             help_text="The agent the grant is delegated to.")
    created_by_agent = models.CharField(max_length=200, null=True, blank=True)
    created_by_user = models.CharField(max_length=200, null=True, blank=True)
    created_via = models.CharField(max_length=20, help_text="api, cli, break-glass or hop.")
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, null=True, blank=True)
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the delegation and its revocation.")

    class Meta:
        ordering = ["created_at", "delegation_id"]
        permissions = [("revoke_delegation", "Can revoke delegations")]
        indexes = [models.Index(fields=["revoked_at", "created_at"], name="ctrlrun_delegation_live_idx"),
                   models.Index(fields=["agent"], name="ctrlrun_delegation_agent_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(revoked_at__isnull=True, revoked_by__isnull=True)
                                   | Q(revoked_at__isnull=False, revoked_by__isnull=False),
                                   name="ctrlrun_delegation_revoked_by_someone"),
        ]

    def __str__(self) -> str:
        return f"{self.delegation_id} under {self.parent_id}{' (revoked)' if self.revoked_at else ''}"


class Delivery(models.Model):
    """One mail telling one person about one approval request (``ctrlrun.notify``): who, to which
    address, why they were chosen, and how sending it went.

    Bookkeeping, not evidence, but a page's claim ("ana was told at 10:02") rests on it, so every
    column is signed (``store.signatures.delivery_ok``); a row that fails its signature is never sent
    and the approval's page says it was changed outside ctrlrun. The guard keeps who and why fixed,
    lets only a ``pending`` row change (``attempts`` never goes down) and refuses a delete.
    ``link_nonce`` names the one link this mail carries (``LinkUse`` records its use).
    """

    PENDING, SENT, FAILED, DROPPED = "pending", "sent", "failed", "dropped"
    STATUSES = (PENDING, SENT, FAILED, DROPPED)

    id = models.BigAutoField(primary_key=True)
    approval_id = models.CharField(max_length=ID_LENGTH, help_text="The approval request the mail is about.")
    recipient = models.CharField(max_length=150, help_text="The console user told (their username).")
    address = models.CharField(max_length=254, help_text="Where the mail goes: the user's email address then.")
    basis = models.CharField(max_length=400, help_text="Why this person: role:NAME (each role the request pins), "
                                                       "setting, or permission.")
    status = models.CharField(max_length=10, choices=[(s, s) for s in STATUSES], default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(null=True, blank=True, help_text="Why the last attempt failed, or why it "
                                                                   "was dropped.")
    next_try = models.DateTimeField(null=True, blank=True, help_text="When a pending mail is tried next.")
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    link_nonce = models.CharField(max_length=40, unique=True, help_text="The identity of the mail's one link.")
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of every column.")

    class Meta:
        ordering = ["approval_id", "recipient"]
        constraints = [models.UniqueConstraint(fields=["approval_id", "recipient"], name="ctrlrun_delivery_once")]
        indexes = [models.Index(fields=["status", "next_try"], name="ctrlrun_delivery_due_idx")]

    def __str__(self) -> str:
        return f"mail about {self.approval_id} to {self.recipient} ({self.status})"


class LinkUse(models.Model):
    """A mail's link was used: it works once. Inserted once, never changed or deleted (the guard);
    signed, though any row under a nonce, signed or not, is enough to refuse the link again."""

    nonce = models.CharField(max_length=40, primary_key=True, help_text="The link's identity (Delivery.link_nonce).")
    approval_id = models.CharField(max_length=ID_LENGTH)
    used_by = models.CharField(max_length=150, help_text="The console user who opened it (its addressee).")
    used_at = models.DateTimeField()
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True)

    class Meta:
        ordering = ["used_at"]

    def __str__(self) -> str:
        return f"link {self.nonce} used by {self.used_by}"


class PruneCheckpoint(models.Model):
    """Where a prune (``manage.py prune``) left the receipt chain: the seq and hash of the last receipt it
    removed, so ``receipts --verify-chain`` walks the rest from there. Append-only, signed; the guard
    takes one only inside the retention module's transaction (docs/retention.md)."""

    id = models.BigAutoField(primary_key=True)
    seq = models.BigIntegerField(unique=True, help_text="The last receipt seq the prune removed.")
    hash = models.CharField(max_length=HASH_LENGTH, help_text="That receipt's hash: the next one's prev_hash.")
    schema = models.CharField(max_length=40, help_text="The receipt schema it was written under.")
    at = models.DateTimeField(help_text="When (the store's clock).")
    by = models.CharField(max_length=200)
    reason = models.TextField()
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the position, who and why.")

    class Meta:
        ordering = ["-seq"]
        db_table = "ctrlrun_prunecheckpoint"


class Hold(models.Model):
    """A legal hold on a range of receipt seqs (``manage.py hold``): never pruned while live. Placed once,
    released once (who and when), never deleted; signed."""

    hold_id = models.CharField(primary_key=True, max_length=200)
    from_seq = models.BigIntegerField()
    to_seq = models.BigIntegerField(null=True, blank=True, help_text="Empty: to the end of the chain.")
    reason = models.TextField()
    placed_by = models.CharField(max_length=200)
    placed_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.CharField(max_length=200, null=True, blank=True)
    mac = models.CharField(max_length=MAC_LENGTH, null=True, blank=True,
                           help_text="ctrlrun's signature of the hold and its release.")

    class Meta:
        ordering = ["placed_at", "hold_id"]
        db_table = "ctrlrun_hold"
        permissions = [("view_retention", "Can see anchors, holds and prunes")]


class RetentionLock(models.Model):
    """The one row behind the guard's only scoped lift: the next link of a hash chain whose seed is
    derived from the signing key. A prune reveals the preimage (``digest`` becomes it, ``open``
    true) inside its transaction and closes it again before commit; nothing else can (guard v12)."""

    id = models.PositiveSmallIntegerField(primary_key=True)
    digest = models.CharField(max_length=64)
    remaining = models.BigIntegerField()
    open = models.BooleanField(default=False)
    key_id = models.CharField(max_length=64)

    class Meta:
        db_table = "ctrlrun_retentionlock"


class Continuation(models.Model):
    """A suspended attempt (``ctrlrun.Suspended``): the continuation that resumes it, held once.

    One row per effect key; its identity is the key and the attempt it suspended. ``continuation``
    is the SHA-256 of the token the executor raised (the token itself is never stored), and is
    emptied by the one resume that takes it (``store.take_continuation``: a conditional UPDATE).
    ``action_json`` is the suspended call as the effect record stashed it (its action, decision and
    approval), so the resume finishes the very call. ``rounds`` counts the suspensions of this
    attempt; ``held_until`` is when the suspension lapses like a lease. Signed
    (``signatures.continuation_mac``) over every column a resume reads.
    """

    effect_key = models.CharField(primary_key=True, max_length=MAX_KEY_LENGTH)
    action_id = models.CharField(max_length=ID_LENGTH)
    attempt = models.PositiveIntegerField()
    action_json = models.TextField()
    continuation = models.CharField(max_length=71, null=True, blank=True, db_index=True)
    rounds = models.PositiveIntegerField(default=0)
    held_until = models.DateTimeField()
    updated_at = models.DateTimeField()
    mac = models.CharField(max_length=200, null=True, blank=True)
