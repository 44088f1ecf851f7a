from __future__ import annotations

import json
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from ...canonical import Principal, evidence_time
from ...errors import InvalidArgument
from ..base import CtrlrunCommand, Error


def principal(text: str, option: str) -> Principal:
    """``AGENT[/USER]``, split on the first '/'."""
    agent, _, user = text.partition("/")
    if not agent.strip() or (_ and not user.strip()):
        raise Error(f"{option} takes AGENT or AGENT/USER, got {text!r}")
    try:
        return Principal(agent=agent, user=user or None)
    except InvalidArgument as exc:
        raise Error(f"{option}: {exc}") from None


class Command(CtrlrunCommand):
    help = ("Delegate a narrower grant from a delegable grant (or delegation) of the policy's authority: the "
            "grant file is one grant without 'id'; the new delegation's id is printed.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--parent", required=True, metavar="ID",
                            help="the delegable grant id of the policy's 'authority:', or a delegation dlg_...")
        parser.add_argument("--file", required=True, metavar="GRANT.yaml",
                            help="one grant (subject, actions, resources ...) without 'id', as YAML")
        parser.add_argument("--as", required=True, dest="as_", metavar="AGENT[/USER]",
                            help="who delegates: the parent's subject (an unauthenticated assertion; the row "
                                 "is marked created_via cli)")
        parser.add_argument("--json", action="store_true", help="print the new delegation as one JSON object")

    def run(self, *, parent: str, file: str, as_: str, json: bool = False, **_: Any) -> None:
        from ...control import default_control
        from ...policy import parse_grant

        from ...policy import MAX_POLICY_BYTES

        by = principal(as_, "--as")
        path = Path(file)
        try:  # never more than a policy may be: a huge file (or /dev/zero) is refused by its size
            with path.open("rb") as handle:
                data = handle.read(MAX_POLICY_BYTES + 1)
            if len(data) > MAX_POLICY_BYTES:
                raise Error(f"cannot read {file}: a grant file is at most {MAX_POLICY_BYTES:,} bytes")
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except (OSError, UnicodeError) as exc:
            raise Error(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from None
        grant = parse_grant(text, file)
        made = default_control().delegate(parent, grant, by=by, via="cli")
        if json:
            self.stdout.write(_json({
                "delegation_id": made.id, "parent_id": made.parent_id, "depth": made.depth,
                "created_by_agent": made.created_by_agent, "created_by_user": made.created_by_user,
                "created_via": made.created_via, "created_at": evidence_time(made.created_at)}))
            return
        self.stdout.write(f"created {made.id}")
        self.stdout.write(f"parent {made.parent_id} at depth {made.depth}")
        self.stdout.write(f"revoke it with: {self.command_line('revoke')} {made.id}")


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document, ensure_ascii=False)
