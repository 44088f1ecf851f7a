from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ... import report, store
from ...canonical import evidence_time
from ...display import dumps, hidden_fields, reveal, warning
from ...report import BUDGET_SCHEMA, budget_document, budget_lines
from ...errors import CTRLRunError
from ...messages import reason_gloss
from ..base import CtrlrunCommand, Error

INSPECTION_SCHEMA = "ctrlrun.inspection/v2"


def _readable(receipt: Any) -> dict[str, Any] | None:
    """The receipt's document, or None when the stored text is not a JSON object (tampered, damaged)."""
    try:
        doc = receipt.doc
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class Command(CtrlrunCommand):
    help = ("Show one action: who asked, what, the decision, its effect, its receipts and every event. "
            "With --grant ID: what that grant's budgets have spent and hold.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("action_id", nargs="?", help="the act_... id (from 'effects', 'receipts --json' or an "
                                                         "error message), or a ctr_... receipt id from 'receipts'")
        parser.add_argument("--grant", metavar="ID", help="show a grant of the policy's authority section instead: "
                                                          "per budget what is spent, held (and by which calls)")
        parser.add_argument("--hop", metavar="DLG", help="show a hop (a delegation made with Control.hop) "
                                                         "instead: who made it for whom, and its chain to the root")
        parser.add_argument("--json", action="store_true", help=f"print a {INSPECTION_SCHEMA} document "
                                                                f"({BUDGET_SCHEMA} with --grant, {HOP_SCHEMA} with "
                                                                f"--hop)")

    def run(self, *, action_id: str | None, json: bool, grant: str | None = None, hop: str | None = None,
            **_: Any) -> None:
        if sum(x is not None for x in (action_id, grant, hop)) > 1:
            raise Error("give one of an action id, --grant ID or --hop DLG")
        if grant is not None:
            self._grant(grant, json)
            return
        if hop is not None:
            self._hop(hop, json)
            return
        if action_id is None:
            raise Error("give an action id (act_... or ctr_...) or --grant ID")
        if action_id.startswith("ctr_"):  # a receipt id, as 'receipts' prints: show its action
            receipt = store.get_receipt(action_id)
            if receipt is None:
                raise Error(f"no receipt {action_id}; 'receipts' lists them")
            action_id = receipt.action_id
        events = store.events_for_action(action_id)
        receipts = store.receipts_for_action(action_id)
        if not events and not receipts:
            raise Error(f"no action {action_id}; give an act_... id ('effects', 'receipts --json') or a ctr_... "
                        f"receipt id ('receipts')")
        keys = sorted({e.effect_key for e in events if e.effect_key})
        effects = [store.get_effect(k) for k in keys]
        effects = [e for e in effects if e is not None]
        proposed = next((e.data.get("action") for e in events if e.type == "ACTION_PROPOSED"), None) or {}
        readable = {r.receipt_id: _readable(r) for r in receipts}
        docs = [doc for doc in readable.values() if doc is not None]
        last = docs[-1] if docs else {}
        evaluated = next((e.data for e in events if e.type == "POLICY_EVALUATED"), {})
        action_hash = last.get("action_hash") or next(
            (e.data.get("action_hash") for e in events if e.type == "ACTION_PROPOSED"), None)
        approvals = store.approvals_for_hash(action_hash) if action_hash else []
        summary = {
            "name": last.get("action") or proposed.get("name"),
            "principal": last.get("principal") or proposed.get("principal"),
            "resource": last.get("resource", proposed.get("resource")),
            "environment": last.get("environment") or proposed.get("environment"),
            "arguments": last.get("arguments", proposed.get("arguments")),
            "decision": last.get("decision") or evaluated.get("decision"),
            "reason": last.get("decision_reason") or evaluated.get("reason"),
        }
        # Names, arguments and keys hold whatever the agent sent: their invisible or
        # direction-changing characters are shown escaped (ctrlrun.display), with a warning.
        hidden = hidden_fields(summary, " ".join(keys) or None)
        if json:
            unreadable = [receipt_id for receipt_id, doc in readable.items() if doc is None]
            if hidden:
                self.stderr.write(f"warning: {warning(hidden)}")
            self._json(action_id, summary, effects, docs, events, unreadable, approvals)
        else:
            self._text(action_id, summary, effects, receipts, events, readable, approvals, hidden)

    def _hop(self, hop_id: str, as_json: bool) -> None:
        """``inspect --hop``: one delegation, who made it for whom, and each link of its chain."""
        from ...policy.authority import DIMENSIONS

        rows = {row.id: row for row in store.list_delegations()}
        row = rows.get(hop_id)
        if row is None:
            raise Error(reveal(f"no hop {hop_id}: no delegation has that id ('delegate' and Control.hop make them)"))
        chain, missing, current, seen = [], None, row, set()
        while current is not None and current.id not in seen:
            seen.add(current.id)
            parent = rows.get(current.parent_id)
            parent_grant = parent.grant if parent is not None else self._root_grant(current.parent_id)
            narrowed = [] if current.grant is None or parent_grant is None else [
                dimension for dimension in DIMENSIONS if _dimension(current.grant, dimension)
                != _dimension(parent_grant, dimension)]
            chain.append({"id": current.id, "parent_id": current.parent_id, "depth": current.depth,
                          "created_via": current.created_via,
                          "revoked_at": evidence_time(current.revoked_at) if current.revoked_at else None,
                          "narrowed": narrowed})
            if parent is None and parent_grant is None:
                missing = current.parent_id
            current = parent
        root = chain[-1]["parent_id"] if missing is None else None
        grant = row.grant
        document = {
            "schema": HOP_SCHEMA, "hop": row.id,
            "created_by": {"agent": row.created_by_agent, "user": row.created_by_user},
            "created_at": evidence_time(row.created_at) if row.created_at else None,
            "created_via": row.created_via,
            "subject": {"agent": grant.agent, "user": grant.user} if grant is not None else None,
            "depth": row.depth, "revoked_at": evidence_time(row.revoked_at) if row.revoked_at else None,
            "root_id": root, "missing_parent_id": missing, "chain": chain,
        }
        if as_json:
            self.stdout.write(dumps(document, indent=2))
            return
        subject = document["subject"] or {}
        lines = [f"{row.created_via} {row.id}",
                 f"created by {row.created_by_agent or '-'}{'/' + row.created_by_user if row.created_by_user else ''}"
                 f" at {document['created_at']}",
                 f"issued to {subject.get('agent') or '-'}{'/' + subject['user'] if subject.get('user') else ''}",
                 f"depth {row.depth}" + (f", revoked at {document['revoked_at']}" if row.revoked_at else "")]
        for link in chain:
            narrowed = ", ".join(link["narrowed"]) or "nothing"
            lines.append(f"  {link['id']} under {link['parent_id']} (depth {link['depth']}): narrows {narrowed}"
                         + (f"; revoked at {link['revoked_at']}" if link["revoked_at"] else ""))
        lines.append(f"root {root}" if root else f"root missing: {missing} is neither a grant nor a delegation")
        for line in lines:
            self.stdout.write(reveal(line))

    @staticmethod
    def _root_grant(grant_id: str) -> Any:
        from ...control import default_control

        try:
            authority = default_control().read_policy().authority
        except CTRLRunError:
            return None
        return authority.grants.get(grant_id) if authority is not None else None

    def _grant(self, grant_id: str, as_json: bool) -> None:
        """``inspect --grant``: the grant's budgets, from the policy read without touching the store."""
        from ...control import default_control

        try:
            policy = default_control().read_policy()
        except CTRLRunError as exc:
            raise Error(reveal(f"the policy did not load, so its grants are unknown: {exc}", multiline=True)) from None
        authority = policy.authority
        if authority is None:
            raise Error(reveal(f"no grant {grant_id}: the policy ({policy.source}) has no authority section"))
        found = authority.grants.get(grant_id)
        if found is None and grant_id.startswith("dlg_"):  # a delegation's budgets are charged as a grant's
            from ... import store

            delegation = store.get_delegation(grant_id)
            found = delegation.grant if delegation is not None else None
        if found is None:
            known = ", ".join(authority.grants) or "none"
            raise Error(reveal(f"no grant {grant_id}; the policy's grants are: {known}"))
        document = budget_document(found)
        if as_json:
            self.stdout.write(dumps(document, indent=2))
        else:
            for line in budget_lines(document, self.command_line("resolve")):
                self.stdout.write(reveal(line))

    def _text(self, action_id: str, summary: dict[str, Any], effects: list[Any], receipts: list[Any],
              events: list[Any], readable: dict[str, dict[str, Any] | None], approvals: list[Any],
              hidden: list[str]) -> None:
        def out(line: str) -> None:  # every line with hidden characters escaped
            self.stdout.write(reveal(line))

        principal = summary["principal"] or {}
        who = (principal.get("agent") or "-") + (f" (user {principal['user']})" if principal.get("user") else "")
        out(f"{action_id}  {summary['name']}")
        if hidden:
            out(f"warning: {warning(hidden)}")
        out("")
        out(f"{'principal':<12}{who}")
        out(f"{'resource':<12}{summary['resource'] or '-'}")
        out(f"{'environment':<12}{summary['environment'] or '-'}")
        self.stdout.write(f"{'arguments':<12}{dumps(summary['arguments'], sort_keys=True)}")  # valid JSON still
        gloss = reason_gloss(summary["reason"], summary["decision"])  # 'decision' alone says little
        reason = f"{summary['reason']}: {gloss}" if gloss else summary["reason"] or "-"
        out(f"{'decision':<12}{summary['decision'] or '-'}  ({reason})")
        for approval in approvals:
            by = f" by {approval.approver}" if approval.approver else ""
            out(f"{'approval':<12}{approval.approval_id}  {approval.status}{by}")
        for effect in effects:
            line = f"{'effect':<12}{effect.effect_key}  {effect.state}  attempt {effect.attempt}"
            if effect.resolved_by:
                line += f"  resolved by {effect.resolved_by}"
            out(line)
        if receipts:
            for receipt in receipts:
                doc = readable[receipt.receipt_id]
                if doc is None:
                    out(f"{'receipt':<12}{receipt.receipt_id}  UNREADABLE  (its stored document could not be read; "
                        f"run 'receipts --verify-chain')")
                else:
                    out(f"{'receipt':<12}{receipt.receipt_id}  {doc.get('result')}")
        elif any(e.type == "APPROVAL_REQUESTED" for e in events):
            out(f"{'receipt':<12}-  (none: the call stopped to ask a person; it gets one when it runs)")
        else:
            out(f"{'receipt':<12}-  (none: the call has not finished, or its worker died)")
        out("")
        for event in events:
            out(report.event_line(event))

    def _json(self, action_id: str, summary: dict[str, Any], effects: list[Any], docs: list[dict[str, Any]],
              events: list[Any], unreadable: list[str], approvals: list[Any]) -> None:
        document = {
            "schema": INSPECTION_SCHEMA,
            "action_id": action_id,
            **summary,
            "receipt": docs[-1] if docs else None,
            "receipts": docs,
            "unreadable_receipts": unreadable,
            "effect": self._effect(effects[0]) if effects else None,
            "approvals": [
                {"approval_id": a.approval_id, "status": a.status, "approver": a.approver, "note": a.note,
                 "action_hash": a.action_hash, "requested_by_action": a.action_id,
                 "created_at": evidence_time(a.created_at), "expires_at": evidence_time(a.expires_at),
                 "answered_at": evidence_time(a.answered_at), "consumed_at": evidence_time(a.consumed_at),
                 "consumed_by": a.consumed_by}
                for a in approvals
            ],
            "events": [
                {"event_id": e.id, "ts": evidence_time(e.ts), "type": e.type, "action_id": e.action_id,
                 "effect_key": e.effect_key, "approval_id": e.approval_id, "data": e.data}
                for e in events
            ],
        }
        self.stdout.write(dumps(document, indent=2))  # hidden characters as JSON escapes: the same document

    @staticmethod
    def _effect(effect: Any) -> dict[str, Any]:
        return {
            "effect_key": effect.effect_key, "state": effect.state, "action_id": effect.action_id,
            "attempt": effect.attempt, "created_at": evidence_time(effect.created_at),
            "updated_at": evidence_time(effect.updated_at), "lease_expires_at": evidence_time(effect.lease_expires_at),
            "error": effect.error, "resolved_by": effect.resolved_by,
        }


#: The document ``inspect --hop --json`` prints.
HOP_SCHEMA = "ctrlrun.hop/v1"


def _dimension(grant: Any, dimension: str) -> Any:
    """One dimension of a grant, comparable between a child and its parent."""
    if dimension == "subject":
        return (grant.agent, grant.user)
    if dimension == "constraints":
        return None if grant.constraints is None else sorted((c.key, repr(c.operand)) for c in grant.constraints)
    if dimension == "budgets":
        return None if grant.budgets is None else sorted(tuple(sorted(b.canonical().items())) for b in grant.budgets)
    return getattr(grant, dimension)
