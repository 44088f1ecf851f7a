"""What ctrlrun says to people, in one place: functions of facts, returning text.

Pure (standard library and ctrlrun's pure layer). The store raises errors carrying facts
(``StateConflict``'s what, ident, expected, found) and takes the wording of the messages its
callers read from here; the commands, the console and ``reconcile`` word a ``StateConflict``
with :func:`state_conflict`, each adding what to do next in its own terms.

Command names. Where a message names a command it names both ways to run it: ``ctrlrun NAME``
(the console script) and ``python manage.py NAME`` (inside a Django project), or the caller
passes ``command_line`` and the message names it the caller's way.
"""
from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .times import evidence_time

__all__ = [
    "TAMPERED_HINT", "entry", "command", "approval_required", "OPEN_TRANSACTION", "store_unavailable", "unknown_alias",
    "refuses_to_act", "refuses_to_add", "head_key_mismatch", "head_unsigned", "HEAD_MISSING", "head_missing_restore",
    "BEYOND_HEAD",
    "already_committed", "in_progress", "lease_lapsed", "unknown_outcome", "tampered_effect",
    "outcome_not_recorded", "outcome_refused", "approval_unknown", "approval_tampered", "approval_mismatch",
    "approval_denied", "approval_not_granted", "approval_expired_ask_again", "own_request",
    "ANSWER_NEEDS_NAME", "RESOLVE_NEEDS_NAME", "resolve_which", "state_conflict",
]


def entry() -> str | None:
    """How this process runs ctrlrun's commands: ``"project"`` (Django settings a project configured:
    ``python manage.py``), ``"script"`` (ctrlrun's standalone configuration: ``ctrlrun``), or None
    (Django not configured yet). Read from Django's settings only if Django is already loaded."""
    module = sys.modules.get("django.conf")
    settings = getattr(module, "settings", None)
    if settings is None or not settings.configured:
        return None
    return "script" if getattr(settings, "CTRLRUN_STANDALONE", False) else "project"


def command(name: str) -> str:
    """A command named the way it is run here: ``'python manage.py NAME'`` inside a Django project,
    ``'ctrlrun NAME'`` in a plain script, both ways when that is not known."""
    where = entry()
    if where == "project":
        return f"'python manage.py {name}'"
    if where == "script":
        return f"'ctrlrun {name}'"
    return f"'ctrlrun {name}' (or 'python manage.py {name}')"


#: Why a row ctrlrun must trust is refused, and what to do.
TAMPERED_HINT = ("it was written or changed outside ctrlrun (its signature does not verify, or the event chain "
                 "shows it is out of date). Nothing ran; run 'ctrlrun receipts --verify-chain' and find out who "
                 "changed it")


# --------------------------------------------------------------------------- the store itself


OPEN_TRANSACTION = ("a protected call cannot run inside an open transaction on ctrlrun's database: its evidence "
                    "would roll back with your work. Call it outside transaction.atomic(), or give ctrlrun a "
                    "database of its own (settings.CTRLRUN_DATABASE)")


def store_unavailable(what: str, error_name: str, detail: str) -> str:
    return f"the ctrlrun store could not {what} ({error_name}: {detail}); nothing was recorded by that step"


def unknown_alias(alias: Any, known: Sequence[str]) -> str:
    return f"store.using({alias!r}): no such database alias in settings.DATABASES (known: {', '.join(known)})"


def refuses_to_act(problem: str, *, restore: bool = True) -> str:
    """A call stopped before anything ran because the evidence cannot be trusted."""
    if not restore:
        return f"ctrlrun refuses to act: {problem}. Nothing ran"
    return (f"ctrlrun refuses to act: {problem}. Nothing ran; run 'ctrlrun receipts --verify-chain' and restore "
            f"the store from a backup")


def refuses_to_add(problem: str) -> str:
    return f"ctrlrun refuses to add evidence: {problem}. Nothing was recorded; run 'ctrlrun receipts --verify-chain'"


def head_key_mismatch(found: str | None, mine: str, source: str) -> str:
    return (f"the chain head names signing key id {found}, and this process's key ({source}) has id {mine}: either "
            f"this process was not given the store's key (every process of one store needs the same "
            f"CTRLRUN_SIGNING_KEY or SECRET_KEY), or the head was changed outside ctrlrun")


def head_unsigned(seq: int, event_seq: int) -> str:
    return (f"the chain head (receipt seq {seq}, event seq {event_seq}) does not carry ctrlrun's signature: it was "
            f"moved outside ctrlrun")


def policy_document_forged(policy_hash: str) -> str:
    return (f"the policy text stored under this policy's hash {policy_hash} is not the one ctrlrun stored (its "
            f"signature or its text does not match): it was written outside ctrlrun, and a page would show it as the "
            f"rules that decided. The store's owner must remove that row")


HEAD_MISSING = "the chain head row is missing while receipts or events exist"
BEYOND_HEAD = "a receipt or event lies past the chain head: it was added outside ctrlrun"


# --------------------------------------------------------------------------- refusals the protected call's caller reads


def _resolve_hint(key: str) -> str:
    where = entry()
    if where == "project":
        return f"'python manage.py resolve {key} --committed' or '--failed'"
    if where == "script":
        return f"'ctrlrun resolve {key} --committed' or '--failed'"
    return f"'ctrlrun resolve {key} --committed' or '--failed' (or 'python manage.py resolve ...')"


def approval_required(action: str, approval_id: str) -> str:
    """What ``ApprovalRequired`` says: who answers, as commands are run here, and how to retry."""
    return (f"{action} requires approval: run {command(f'approve {approval_id}')}, then retry inside "
            f"ctrlrun.with_approval('{approval_id}')")


def already_committed(key: str, action_id: str) -> str:
    return f"effect '{key}' was already committed by {action_id}; it will not run again"


def in_progress(key: str, action_id: str, attempt: int, lease_until: dt.datetime | None) -> str:
    until = evidence_time(lease_until) if lease_until is not None else "-"
    return (f"effect '{key}' is executing under {action_id} (attempt {attempt}, lease until {until}); wait for it "
            f"to finish")


def lease_lapsed(key: str, action_id: str) -> str:
    return (f"effect '{key}' was left executing by {action_id} and its lease expired; ask the remote what happened, "
            f"then resolve it with {_resolve_hint(key)}")


def unknown_outcome(key: str, action_id: str) -> str:
    return (f"effect '{key}' has an unknown outcome from {action_id}; resolve it with {_resolve_hint(key)} before "
            f"retrying")


def tampered_effect(key: str, state: str) -> str:
    return f"effect '{key}' is {state}, but {TAMPERED_HINT}; it will not run until a person has checked the remote"


def outcome_not_recorded(key: str, *, found: str | None, resolved_by: str | None, action_id: str | None,
                         attempt: int | None) -> str:
    """Why an attempt's outcome could not be written on its record, from what the record is now."""
    if found is None:
        what = "its record is gone"
    elif resolved_by:
        what = f"it was resolved {found} by {resolved_by} while this attempt ran"
    elif found == "ambiguous":
        what = "this attempt's lease lapsed and another attempt marked it ambiguous"
    else:
        what = f"it is now {found} under {action_id} (attempt {attempt})"
    return f"the outcome of effect '{key}' could not be recorded: {what}. Check the remote, then resolve it with " \
           f"{_resolve_hint(key)}"


def outcome_refused(result: str, error: str | None, refusal: str) -> str:
    """The error recorded when the function ended but its outcome write was refused."""
    if result == "committed":
        return (f"the function returned, so the remote may well have acted, and the outcome write was refused: "
                f"AmbiguousEffect: {refusal}")
    if result == "failed":
        return (f"the function raised NotExecuted: {error}, and the outcome write was refused: AmbiguousEffect: "
                f"{refusal}")
    return f"{error}; and the outcome write was refused: AmbiguousEffect: {refusal}"


def approval_unknown(approval_id: str) -> str:
    return f"no approval {approval_id}"


def approval_tampered(approval_id: str) -> str:
    return f"approval {approval_id} cannot be used: {TAMPERED_HINT}"


def approval_mismatch(approval_id: str, granted_for: str, action_hash: str) -> str:
    return (f"approval {approval_id} authorizes {granted_for}, not {action_hash}: it was granted for a different "
            f"call (other arguments, agent, resource or environment)")


def approval_denied(approval_id: str, approver: str | None) -> str:
    return f"approval {approval_id} was denied by {approver}"


def approval_not_granted(approval_id: str, status: str) -> str:
    return f"approval {approval_id} is {status}, not granted"


def approval_expired_ask_again(approval_id: str, expires_at: dt.datetime) -> str:
    return f"approval {approval_id} expired at {evidence_time(expires_at)}; ask again"


def precondition_changed(approval_id: str, at_request: str, at_recheck: str) -> str:
    return (f"approval {approval_id} was granted for another state of the world: the preconditions were "
            f"{at_request} when it was asked, and are {at_recheck} now; it stays granted: ask the approver to look "
            f"again, or retry once the state is back")


def precondition_missing(approval_id: str, at_request: bool) -> str:
    if at_request:
        return (f"approval {approval_id} was asked with preconditions, and this call reads none: present it on "
                f"a call with the same preconditions=...; it stays granted")
    return (f"approval {approval_id} was asked without preconditions, and this call has some: the approver never "
            f"saw a state to compare with; ask again with preconditions=...; it stays granted")


def precondition_unavailable(approval_id: str, problem: str) -> str:
    return f"approval {approval_id} cannot be checked against the state now: {problem}; it stays granted"


# --------------------------------------------------------------------------- a person's bad arguments


def own_request(action: str, user: str, by: str) -> str:
    alias = "" if user == by else f" ({by!r} names the same person)"
    return (f"this request for {action} was made on behalf of user {user}, who cannot answer it{alias}; another "
            f"person must")


ANSWER_NEEDS_NAME = "an approval needs the name of the person answering (--by NAME)"
RESOLVE_NEEDS_NAME = "a resolution needs the name of the person who decided it (--by NAME)"


def resolve_which(outcome: Any) -> str:
    return f"say which it was: committed or failed, not {outcome!r}"


# --------------------------------------------------------------------------- a row not in the state asked for


def state_conflict(conflict: Any, command_line: Callable[[str], str] | None = None) -> str:
    """``conflict`` (a ``ctrlrun.errors.StateConflict``: ``errors`` imports this module, never the
    reverse) worded for a person; ``command_line(name)`` names a command the caller's way (the
    commands pass theirs; without it no command is named)."""
    what, ident, found, facts = conflict.what, conflict.ident, conflict.found, conflict.facts
    if what == "approval":
        if found == "missing":
            return f"no approval request {ident}" + (
                f"; '{command_line('approvals')}' lists the requests" if command_line else "")
        if found == "tampered":
            return f"approval request {ident} cannot be answered: {TAMPERED_HINT}"
        if found == "expired" and facts.get("expires_at") is not None and facts.get("just_expired"):
            return f"approval {ident} expired at {evidence_time(facts['expires_at'])}; the agent must ask again"
        return f"approval request {ident} is already {found}"
    # an effect record
    reconciling = facts.get("operation") == "reconcile"
    if found == "missing":
        return f"no effect '{ident}'" if reconciling else f"no effect '{ident}' to resolve"
    if found == "tampered":
        return f"effect '{ident}' says ambiguous, but {TAMPERED_HINT}. It may still be running; it is not resolved"
    if facts.get("attempt") is not None:
        return (f"effect '{ident}' is at attempt {facts['attempt']}, not {facts['expected_attempt']}: it moved "
                f"since you looked. Check it again before resolving")
    if reconciling:
        return f"effect '{ident}' is {found}; only an ambiguous effect is reconciled"
    hint = " (its lease has lapsed: a reconcile pass sweeps it to ambiguous first)" if facts.get("lapsed") else ""
    return (f"effect '{ident}' is {found}, not ambiguous; only an effect with an unknown outcome is resolved by "
            f"hand{hint}")


def head_missing_restore() -> str:
    return f"{HEAD_MISSING}; run 'ctrlrun receipts --verify-chain' and restore the store from a backup"


def window_text(seconds: int) -> str:
    """A budget's window in words: ``1 day``, ``2 hours``, ``1 hour 30 minutes``, ``45 seconds``."""
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count != 1 else ''}")
    return " ".join(parts) or "0 seconds"


def budget_exhausted(metric: str, grant_id: str, window_seconds: int, spent: int, limit: int, amount: int) -> str:
    """A call refused because one of its budget charges does not fit (authority, §C5)."""
    left = max(limit - spent, 0)
    return (f"budget {metric!r} on grant {grant_id!r} over {window_text(window_seconds)} is exhausted: {spent:,} of "
            f"{limit:,} spent, this call needs {amount:,}" + (f" ({left:,} left)" if left else "")
            + ". Nothing ran; charges of calls that end failed are given back, and older ones leave the window")


def budget_needs_key(action: str) -> str:
    return (f"{action}: a call with budget charges needs an effect key (the ledger charges the attempt that holds "
            f"the key); give the action an effect")


def attempt_ceiling(action: str, effect_key: str | None, attempt: int, max_attempts: int) -> str:
    """The attempt ceiling's refusal (policy v5 ``max_attempts``)."""
    return (f"{action}: attempt {attempt} of {effect_key!r} refused: max_attempts is {max_attempts}, and it has "
            f"failed {attempt - 1} time{'s' if attempt != 2 else ''}. Find out why before trying again; if another "
            f"attempt is right, raise max_attempts in the policy")


#: What a policy's reasons mean, for a person reading ``stats`` or ``inspect`` (the reason itself
#: stays as recorded: this is its gloss). ``rule[N]`` names its rule and needs none.
REASON_GLOSSES = {
    "unknown_action": "the policy does not name the action",
    "no_matching_rule": "no rule of the entry matched",
}


def reason_gloss(reason: str | None, decision: str | None = "deny") -> str | None:
    """What a policy reason means (``decision`` -> "the entry's decision is deny"), or None."""
    if reason == "decision":
        return f"the entry's decision is {decision}" if decision else None
    return REASON_GLOSSES.get(reason or "")


def denial_reason(reason: str) -> str:
    """A denial reason with what it means: ``decision (the entry's decision is deny)``."""
    gloss = reason_gloss(reason)
    return f"{reason} ({gloss})" if gloss else reason
