"""``ctrlrun mcp-operator`` (spec §E4): answering approvals and AMBIGUOUS records from an MCP client.

An MCP server built with the ``mcp`` SDK (``MCPServer``, Streamable HTTP). Reads need no credential;
writes (``approve``, ``deny``, ``resolve``) need a principal with a user, established by the
operator's identity provider (trusted headers or a verified bearer JWT, ``ctrlrun.identity`` /
``ctrlrun.jwt_identity``) from each request's headers. A grant is recorded by the store as a
verified approver (``approvers.ClaimedPerson``): the roles are the principal's
``claims[roles_claim]``, matched byte for byte against each pinned ``approver_role``; the store
applies the requester rule and M-of-N. The answer is attributed as ``mcp-operator:<user>``.

Refusals are JSON-RPC errors with the gateway's codes (``ctrlrun.gateway.wire.ERRORS``): no
principal ``-41007``, no user ``-41013``, expired ``-41014``, a missing role ``-41015``, a store
refusal ``-41003 ctrlrun.approval_denied`` with ``data.reason``.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from .canonical import Principal
from .errors import IdentityError, InvalidArgument, StateConflict
from .identity import IdentityContext

__all__ = ["Operator", "SERVER_NAME", "VIA", "TOOLS"]

SERVER_NAME = "ctrlrun-mcp-operator"
VIA = "mcp-operator"
TOOLS = ("list_pending_approvals", "inspect_action", "receipts", "effects", "stats", "approve", "deny", "resolve")
INSTRUCTIONS = ("ctrlrun's operator console over MCP. Read tools (list_pending_approvals, inspect_action, receipts, "
                "effects, stats) answer without a credential. approve, deny and resolve are answered by the "
                "verified person the request's credential names; the agent asking for an action can never "
                "approve it itself.")


def _error(name: str, message: str, **data: Any) -> Exception:
    from mcp.shared.exceptions import MCPError

    from .gateway.wire import ERRORS

    code, token, _status = ERRORS[name]
    return MCPError(code, message, {"error": token, **data})


def _invalid(message: str) -> Exception:
    from mcp.shared.exceptions import MCPError

    return MCPError(-32602, message)


def _result(value: Any) -> Any:
    from mcp.types import CallToolResult, TextContent

    return CallToolResult(content=[TextContent(type="text", text=json.dumps(value, indent=2, ensure_ascii=False,
                                                                             default=str))],
                          structured_content=value)


def _limit(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 200:
        raise _invalid(f"limit must be an integer from 1 to 200, got {value!r}")
    return value


def _iso(moment: dt.datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _approval(view: Any) -> dict[str, Any]:
    return {"request_id": view.approval_id, "status": view.status, "action": view.action, "action_id": view.action_id,
            "action_hash": view.action_hash, "principal": {"agent": view.agent, "user": view.user},
            "effect_key": view.effect_key, "reason": view.decision_reason, "created_at": _iso(view.created_at),
            "expires_at": _iso(view.expires_at), "approvals_required": view.approvals_required,
            "approvals_recorded": len(view.approvers),
            "required_roles": [r.as_json() for r in view.required_roles]}


class Operator:
    """The tools' behaviour, over the store (``identity``: the provider establishing the operator's person)."""

    def __init__(self, identity: Any, *, roles_claim: str | None, environment: str) -> None:
        self.identity, self.roles_claim, self.environment = identity, roles_claim, environment

    # ------------------------------------------------------------------ who
    def person(self, headers: Mapping[str, str] | None, tool: str) -> tuple[Principal, frozenset[str]]:
        context = IdentityContext(action=f"{VIA}.{tool}", environment=self.environment, headers=dict(headers or {}))
        try:
            principal = self.identity.resolve(context)
        except IdentityError as exc:
            raise _error("no_principal", f"{tool}: the credential was refused ({exc})") from None
        if principal is None:
            raise _error("no_principal", f"{tool} needs a verified person: present the operator's credential "
                                         f"(its identity headers or bearer token)")
        if not principal.user:
            raise _error("not_a_human", f"{tool} is answered by a human: the principal {principal.agent!r} names "
                                        f"no user")
        if principal.expires_at is not None and principal.expires_at <= dt.datetime.now(dt.timezone.utc):
            raise _error("principal_expired", f"{tool}: the credential expired at "
                                              f"{principal.expires_at.isoformat(timespec='seconds')}; present a "
                                              f"fresh one")
        claimed = (principal.claims or {}).get(self.roles_claim) if self.roles_claim else None
        roles = frozenset(r for r in claimed if isinstance(r, str)) if isinstance(claimed, (list, tuple)) else (
            frozenset([claimed]) if isinstance(claimed, str) else frozenset())
        return principal, roles

    # ------------------------------------------------------------------ reads
    def list_pending(self, limit: int) -> dict[str, Any]:
        from . import store

        pending = [v for v in store.list_approvals("pending")][:limit]
        return {"approvals": [_approval(v) for v in pending], "count": len(pending)}

    def inspect(self, action_id: str) -> dict[str, Any]:
        from . import store

        receipts = store.receipts_for_action(action_id)
        approvals = store.approvals_of_call(action_id)
        if not receipts and not approvals:
            raise _invalid(f"no action {action_id!r} is recorded; list_pending_approvals or receipts name the ids")
        return {"schema": "ctrlrun.inspection/v2", "action_id": action_id,
                "receipts": [r.doc for r in receipts], "approvals": [_approval(a) for a in approvals]}

    def receipts(self, limit: int, control: str | None) -> dict[str, Any]:
        from . import store

        return {"receipts": [r.doc for r in store.list_receipts(last=limit, control=control)]}

    def effects(self, state: str | None) -> dict[str, Any]:
        from . import store

        try:
            found = store.list_effects(state)
        except InvalidArgument as exc:
            raise _invalid(str(exc)) from None
        return {"effects": [{"effect_key": e.effect_key, "action": e.action, "state": e.state,
                             "action_id": e.action_id, "attempt": e.attempt, "resolved_by": e.resolved_by,
                             "updated_at": _iso(e.updated_at)} for e in found]}

    def stats(self, since: str | None) -> dict[str, Any]:
        from . import stats, store

        now = store.now()
        try:
            start = stats.parse_since(since or "24h", now)
        except (InvalidArgument, ValueError) as exc:
            raise _invalid(str(exc)) from None
        documents = [r.doc for r in store.list_receipts() if r.ts >= start]
        return stats.compute(documents, mode=stats.MODES[0], since=start)

    # ------------------------------------------------------------------ writes
    def answer(self, request_id: str, grant: bool, principal: Principal, roles: frozenset[str]) -> dict[str, Any]:
        from . import approvers, store

        view = store.get_approval(request_id)
        if view is None:
            raise _error("approval_denied", f"no approval request {request_id!r}", reason="missing")
        for role in view.required_roles:
            if role.role not in roles:
                raise _error("not_entitled", f"{principal.user} does not hold the role {role.role!r} that control "
                                             f"{role.control!r} requires of every approver",
                             role=role.role, control=role.control)
        by = f"{VIA}:{principal.user}"
        person = approvers.ClaimedPerson(principal.agent, principal.user, principal.issuer or VIA, roles, VIA)
        try:
            answered = store.answer_approval(request_id, grant, by=by, person=person if grant else None)
        except StateConflict as exc:
            actual = exc.found
            said = f"already {actual}" if actual in ("granted", "denied", "expired", "consumed") else str(exc)
            raise _error("approval_denied", f"{request_id}: {said}", reason=said) from None
        except InvalidArgument as exc:
            raise _error("approval_denied", str(exc), reason=str(exc)) from None
        if answered.status == "pending":
            return {"request_id": request_id, "status": "pending", "approvals_required": answered.approvals_required,
                    "approvals_recorded": len(answered.approvers)}
        return {"request_id": request_id, "status": answered.status, "approver": answered.approver,
                "approvals_required": answered.approvals_required, "approvals_recorded": len(answered.approvers),
                "approvers": [a.user for a in answered.approvers]}

    def resolve(self, effect_key: str, outcome: str, reason: str, principal: Principal) -> dict[str, Any]:
        from . import store

        if outcome not in ("committed", "failed"):
            raise _invalid(f"outcome must be 'committed' or 'failed', got {outcome!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise _invalid("resolve needs a reason: say what you checked (e.g. what the remote's dashboard shows)")
        try:
            effect = store.resolve(effect_key, outcome, by=f"{VIA}:{principal.user}", reason=reason.strip(), via=VIA)
        except (StateConflict, InvalidArgument) as exc:
            raise _error("approval_denied", str(exc), reason=str(exc)) from None
        return {"effect_key": effect.effect_key, "state": effect.state, "resolver": effect.resolved_by,
                "reason": reason.strip(), "retry_permitted": effect.state == "failed"}
