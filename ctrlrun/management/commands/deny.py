from __future__ import annotations

from .approve import Command as ApproveCommand


class Command(ApproveCommand):
    help = "Deny a pending approval request: presenting it raises ActionDenied(approval_denied)."
    grant = False
