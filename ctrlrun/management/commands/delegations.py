"""``delegations``: list the delegations of the store, revoked ones too (spec C3's table, read)."""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ... import store
from ...policy.authority import Delegation, Grant, window_text
from ...canonical import evidence_time
from ...display import dumps, reveal
from ..base import CtrlrunCommand


def _who(agent: str | None, user: str | None) -> str:
    return f"{agent or '-'}" + (f"/{user}" if user else "")


def _limits(grant: Grant) -> list[str]:
    """The grant's scope and limits, in words: what it may do, where, within which bounds, until when."""
    parts = [f"actions {','.join(grant.actions)}"]
    if grant.resources is not None:
        parts.append(f"resources {','.join(grant.resources)}")
    if grant.constraints:
        parts.append("constraints " + ", ".join(f"{c.key} {c.operand!r}" if isinstance(c.operand, str)
                                               else f"{c.key} {c.operand}" for c in sorted(grant.constraints,
                                                                                             key=lambda c: c.key)))
    if grant.environments is not None:
        parts.append(f"environments {','.join(grant.environments)}")
    if grant.tasks is not None:
        parts.append(f"tasks {','.join(grant.tasks)}")
    if grant.budgets:
        parts.append("budgets " + ", ".join(f"{b.metric} {b.limit} per {window_text(b.window_seconds)}"
                                            for b in grant.budgets))
    if grant.delegable:
        parts.append("delegable")
    parts.append(f"expires {evidence_time(grant.expires_at)}" if grant.expires_at else "no expiry")
    return parts


def line(row: Delegation) -> str:
    """One delegation as one line; every name and pattern with its hidden characters escaped."""
    head = f"{row.id}  parent {row.parent_id} (depth {row.depth})"
    if row.grant is None:
        scope = [f"UNREADABLE: {row.problem}"]
    else:
        scope = [f"to {_who(row.grant.agent, row.grant.user)}", *_limits(row.grant)]
    made = f"by {_who(row.created_by_agent, row.created_by_user)} via {row.created_via}"
    if row.created_at is not None:
        made += f" at {evidence_time(row.created_at)}"
    state = (f"revoked at {evidence_time(row.revoked_at)} by {row.revoked_by}" if row.revoked_at is not None
             else "active")
    return reveal("  ".join([head, *scope, made, state]))


def document(row: Delegation) -> dict[str, Any]:
    """One delegation as JSON: the table's columns (spec C3), its grant (canonical form) and its state."""
    return {
        "delegation_id": row.id, "parent_id": row.parent_id, "depth": row.depth,
        "agent": row.grant.agent if row.grant else None, "user": row.grant.user if row.grant else None,
        "grant": row.grant.canonical() if row.grant else None,
        "expires_at": evidence_time(row.grant.expires_at) if row.grant and row.grant.expires_at else None,
        "created_by_agent": row.created_by_agent, "created_by_user": row.created_by_user,
        "created_via": row.created_via,
        "created_at": evidence_time(row.created_at) if row.created_at else None,
        "revoked": row.revoked_at is not None,
        "revoked_at": evidence_time(row.revoked_at) if row.revoked_at else None, "revoked_by": row.revoked_by,
        "problem": row.problem,
    }


class Command(CtrlrunCommand):
    help = ("List the delegations (oldest first), revoked ones too: id, parent and depth, the agent it is "
            "delegated to, its grant's actions, resources, constraints, budgets and expiry, who made it, and "
            "whether it is revoked (when, by whom). Names are shown with hidden characters escaped.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--agent", metavar="NAME", help="only delegations to this agent")
        parser.add_argument("--active", action="store_true", help="leave out revoked delegations")
        parser.add_argument("--json", action="store_true",
                            help="print each delegation as one JSON object per line (hidden characters as "
                                 "JSON escapes)")

    def run(self, *, agent: str | None, active: bool, json: bool, **_: Any) -> None:
        rows = store.list_delegations()
        if agent is not None:
            rows = [row for row in rows if row.grant is not None and row.grant.agent == agent]
        if active:
            rows = [row for row in rows if row.revoked_at is None]
        if not rows:
            if not json:
                which = " active" if active else ""
                self.stdout.write(reveal(f"no{which} delegations to agent {agent}") if agent is not None
                                  else f"no{which} delegations yet")
            return
        for row in rows:
            self.stdout.write(dumps(document(row)) if json else line(row))
