"""Small reads behind what the console's pages and the commands claim, returned as values.

Each answers one question a page asks (which state each of these effect records is in, which
receipt sits before this one, which calls spent this budget) in one or a few indexed queries, so
no page reads ctrlrun's models itself. Nothing here writes.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass

from ..models import BudgetLedger, EffectRecord, PausedRun, PolicyDocument, Receipt
from ..states import EffectState
from .base import objects, reading


@dataclass(frozen=True)
class BudgetCall:
    """One call that spent or holds a budget: its charge, and its effect record's state for that attempt.

    ``state`` is ``missing`` when no record holds the key; ``receipt_id`` None while the attempt has
    no receipt yet."""

    effect_key: str
    attempt: int
    amount: int
    consumed_at: dt.datetime
    state: str
    action_id: str | None
    receipt_id: str | None


@dataclass(frozen=True)
class PausedRunBrief:
    """A paused run as an approval's page names it (never its state, which can be megabytes)."""

    id: int
    framework: str
    status: str


def budget_calls(grant_id: str, metric: str, window_seconds: int, now: dt.datetime,
                 limit: int) -> tuple[list[BudgetCall], int]:
    """The calls that spent or hold one budget in its window ending at ``now``, newest first (at most
    ``limit``), and how many there are. Released charges are left out: they spend nothing."""
    with reading():
        rows = objects(BudgetLedger).filter(
            grant_id=grant_id, metric=metric, released_at__isnull=True,
            consumed_at__gt=now - dt.timedelta(seconds=window_seconds), consumed_at__lte=now)
        total = rows.count()
        shown = list(rows.order_by("-consumed_at", "-id").values_list("effect_key", "attempt", "amount",
                                                                      "consumed_at")[:limit])
        keys = {key for key, _attempt, _amount, _at in shown}
        records = {key: (state, attempt, action_id) for key, state, attempt, action_id in
                   objects(EffectRecord).filter(pk__in=keys).values_list("effect_key", "state", "attempt", "action_id")}
        documents = list(objects(Receipt).filter(effect_key__in=keys).order_by("seq")
                         .values_list("receipt_id", "action_id", "effect_key", "document"))
    receipts: dict[tuple[str, int], tuple[str, str]] = {}
    for receipt_id, action_id, effect_key, text in documents:
        try:
            doc = json.loads(text)
        except ValueError:  # an unreadable receipt names no attempt
            continue
        attempt = doc.get("attempt") if isinstance(doc, dict) else None
        if isinstance(attempt, int) and effect_key:
            receipts[(effect_key, attempt)] = (receipt_id, action_id)  # the last one
    calls = []
    for key, charged_attempt, amount, consumed_at in shown:
        state, attempt, action_id = records.get(key, (None, None, None))
        if state is None:
            state = "missing"
        elif attempt != charged_attempt:  # the record was renewed from failed: this attempt failed
            state, action_id = EffectState.FAILED.value, None
        receipt_id, receipt_action = receipts.get((key, charged_attempt), (None, None))
        calls.append(BudgetCall(effect_key=key, attempt=charged_attempt, amount=amount, consumed_at=consumed_at,
                                state=str(state), action_id=receipt_action or action_id, receipt_id=receipt_id))
    return calls, total


def effect_states(effect_keys: Iterable[str]) -> dict[str, str]:
    """The state of each of these effect records that exists, by key (a key with no record is absent)."""
    keys = {key for key in effect_keys if key}
    if not keys:
        return {}
    with reading():
        return {key: str(state) for key, state in
                objects(EffectRecord).filter(pk__in=keys).values_list("effect_key", "state")}


def recorded_actions() -> list[str]:
    """Every action an effect record holds, once each."""
    with reading():
        return list(objects(EffectRecord).values_list("action", flat=True).distinct())


def action_recorded(action: str) -> bool:
    """Whether any effect record holds ``action``."""
    with reading():
        return objects(EffectRecord).filter(action=action).exists()


def receipt_id_at(seq: int) -> str | None:
    """The id of the receipt at chain position ``seq``, or None when no receipt holds it."""
    with reading():
        return objects(Receipt).filter(seq=seq).values_list("receipt_id", flat=True).first()


def policy_stored(policy_hash: str) -> bool:
    """Whether a policy document is stored under ``policy_hash`` (whoever wrote it: see
    ``policy_document`` for the text a page may show)."""
    with reading():
        return objects(PolicyDocument).filter(pk=policy_hash).exists()


def paused_run_brief(approval_id: str) -> PausedRunBrief | None:
    """The paused run stored beside ``approval_id``, by id, framework and status; None when there is none."""
    with reading():
        row = objects(PausedRun).filter(approval_id=approval_id).values_list("id", "framework", "status").first()
    return PausedRunBrief(*row) if row is not None else None
