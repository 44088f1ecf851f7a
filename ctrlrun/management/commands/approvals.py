from __future__ import annotations

import datetime as dt
from argparse import ArgumentParser
from typing import Any

from ... import store
from ...display import dumps, hidden_fields, reveal, warning
from ...states import ApprovalStatus
from ..base import CtrlrunCommand


def _span(delta: dt.timedelta) -> str:
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d"


class Command(CtrlrunCommand):
    help = "List approval requests: pending first (oldest first), with action, arguments, principal, age and expiry."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--status", choices=[s.value for s in ApprovalStatus], help="only requests in this status")

    def run(self, *, status: str | None, **_: Any) -> None:
        approvals = store.list_approvals(status)
        if not approvals:
            self.stdout.write(f"no approval requests are {status}" if status else "no approval requests yet")
            return
        now = store.now()  # the store's clock, as leases and expiries are kept
        for a in approvals:
            # Every name and value with its invisible or direction-changing characters escaped
            # (ctrlrun.display): a terminal would render them, and show other text than what runs.
            who = reveal(a.agent) + (f" (user {reveal(a.user)})" if a.user else "")
            arguments = dumps(a.arguments, sort_keys=True, separators=(",", ":"))
            if a.status == ApprovalStatus.PENDING:
                expiry = f"expires in {_span(a.expires_at - now)}" if a.expires_at > now else "expired (not yet marked)"
            elif a.approver:
                expiry = f"{a.status} by {reveal(a.approver)}"
            else:
                expiry = str(a.status)
            self.stdout.write(
                f"{a.approval_id}  {a.status}  {reveal(a.action)}  {arguments}  {who}  age {_span(now - a.created_at)}  "
                f"{expiry}"
            )
            hidden = hidden_fields(a.canonical_action, a.effect_key)
            if hidden:  # on stderr: stdout keeps one line per request
                self.stderr.write(f"warning: {a.approval_id}: {warning(hidden)}")
