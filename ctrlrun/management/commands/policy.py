"""``policy propose`` and ``policy replay`` (§D7): propose a candidate policy for approval, and see
which recorded decisions it would change. See docs/policy-changes.md."""
from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from ...canonical import Principal
from ...errors import ApprovalRequired, InvalidArgument
from ..base import MAX_COUNT, CtrlrunCommand, Error, default_person

#: The agent a proposal made from the command line is recorded under (the person is its user).
CLI_AGENT = "ctrlrun-cli"


class Command(CtrlrunCommand):
    help = ("The approved-policy flow: 'propose --file NEW.yaml' asks for a person's approval of a candidate "
            "policy (the file is not installed); 'replay --file NEW.yaml' says which recorded decisions it would "
            "change, writing nothing.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="subcommand", metavar="{propose,replay}", required=True)
        propose = commands.add_parser("propose", help="propose a candidate policy (ctrlrun.policy.change)")
        propose.add_argument("--file", required=True, metavar="NEW.yaml", help="the candidate policy file")
        propose.add_argument("--approval", default=None, metavar="APR",
                             help="the granted request (apr_...) that approves this candidate")
        propose.add_argument("--by", default=None, metavar="NAME",
                             help="who proposes (default: the operating-system user); recorded as the user of "
                                  f"agent {CLI_AGENT!r}, so that person cannot approve their own proposal in the "
                                  f"console")
        propose.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
        replay = commands.add_parser("replay", help="decide the last receipts' actions again under a candidate")
        replay.add_argument("--file", required=True, metavar="NEW.yaml", help="the candidate policy file")
        replay.add_argument("--last", default="100", metavar="N", help="how many receipts to replay (default 100)")
        replay.add_argument("--json", action="store_true", help='print {"changed": [...], "skipped": [...]}')
        for sub in (propose, replay):
            sub.error = parser.error  # type: ignore[method-assign]  # one 'Error:' line, exit 2

    def run(self, *, subcommand: str, **options: Any) -> None:
        if subcommand == "propose":
            self.propose(**options)
        else:
            self.replay(**options)

    def propose(self, *, file: str, approval: str | None, by: str | None, json: bool = False, **_: Any) -> None:
        from ...control import default_control
        from ...policy.change import POLICY_CHANGE_ACTION

        person = by if by is not None else default_person()
        try:
            proposer = Principal(agent=CLI_AGENT, user=person)
        except InvalidArgument as exc:
            raise Error(f"--by: {exc}") from None
        control = default_control()
        candidate = control.read_candidate(file)
        current = control.read_policy()
        self.warn_if_observing(current)
        try:
            result = control._propose_policy(file, approval=approval, principal=proposer)
        except ApprovalRequired as asked:
            # The same proposer again (the approval is bound to the call's hash, its principal included).
            again = (f"{self.command_line('policy')} propose --file {file}" + (f" --by {by}" if by is not None else "")
                     + f" --approval {asked.request_id}")
            if json:
                self.stdout.write(_dumps({"status": "pending", "approval_id": asked.request_id,
                                          "action": POLICY_CHANGE_ACTION, "from": current.hash,
                                          "to": candidate.hash}))
                return
            self.stdout.write(f"proposed {asked.request_id}")
            self.stdout.write(f"approve it with: {self.command_line('approve')} {asked.request_id}")
            self.stdout.write(f"then run it again with the approval: {again}")
            return
        if json:
            self.stdout.write(_dumps({"status": "committed", "from": current.hash, "to": result["approved"],
                                      "result": result}))
            return
        self.stdout.write(f"committed {result['approved']}")

    def replay(self, *, file: str, last: str, json: bool = False, **_: Any) -> None:
        from ...control import default_control
        from ...proposals import replay

        try:
            count = int(last)
        except ValueError:
            raise Error(f"--last takes a whole number of receipts, got {last!r}") from None
        if count < 1:
            raise Error(f"--last must be at least 1 (the number of recent receipts to replay), got {count}")
        count = min(count, MAX_COUNT)
        report = replay(default_control(), file, last=count)
        if json:
            self.stdout.write(_dumps(report.json()))
            return
        for line in report.lines():
            self.stdout.write(line)


def _dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, ensure_ascii=False)
