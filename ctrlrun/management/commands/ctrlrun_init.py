from __future__ import annotations

import os
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from ...display import reveal
from ..base import CtrlrunCommand, Error

#: The starter policy ``init`` writes: ours, commented, and loadable as written (a test loads it).
STARTER_POLICY = """\
# ctrlrun policy: what each action your agent can take is allowed to do.
#
# Every protected call names an action (@ctrlrun.protect("stripe.refund")). The policy decides it:
#   allow    run it now
#   approve  stop and ask a person (the console, or 'approvals' / 'approve' on the command line)
#   deny     refuse it, and record the refusal
# An action this file does not list is DENIED. There is no default allow: add an entry for each
# tool before the agent can use it.
#
# effect: "<prefix>:{argument}" names the one real-world consequence a call has. ctrlrun lets that
# key commit at most once, so a retry after a lost reply cannot refund, email or delete twice.
schema: ctrlrun.policy/v2

actions:
  # Reads change nothing, so they need no effect key: allowed as they are.
  crm.lookup_customer:
    decision: allow
  orders.get:
    decision: allow

  # One email per message id, however often the agent retries.
  email.send:
    effect: "email:{message_id}"
    decision: allow

  # Refunds by amount (in cents). Rules are tried in order and the first whose 'when' holds
  # decides; every band is bounded at both ends, so a negative or huge amount falls to the deny.
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 1, amount_lte: 50000 }       # up to 500.00: runs
        decision: allow
      - when: { amount_gte: 50001, amount_lte: 1000000 } # up to 10,000.00: a person decides
        decision: approve
      - decision: deny                                   # anything else: refused

  # Never from an agent.
  iam.grant_admin:
    decision: deny

  # Destructive and rare: always a person's call, and at most once per namespace.
  k8s.delete_namespace:
    effect: "namespace:{cluster}:{name}"
    decision: approve
"""

SETTINGS_SNIPPET = 'CTRLRUN_POLICY = BASE_DIR / "ctrlrun.yaml"'


def write_new(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` only if nothing is there: O_EXCL, so a file made meanwhile by
    anyone else is never overwritten (FileExistsError), and a half-written file is removed."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


class Command(CtrlrunCommand):
    needs_store = False  # no store is opened
    help = ("Write a commented starter policy (ctrlrun.yaml, schema ctrlrun.policy/v2) to edit: two reads "
            "allowed, an email once per message, refunds banded by amount, an admin grant denied, a namespace "
            "deletion that asks a person; anything it does not list is denied. Never overwrites a file. The "
            "console script also creates the .ctrlrun/ folder beside it, where a plain script's store lives.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--path", default="ctrlrun.yaml", metavar="FILE",
                            help="where to write the policy (default: ctrlrun.yaml in the current folder); "
                                 "its folder must exist, and the file must not")

    def run(self, *, path: str, **_: Any) -> None:
        target = Path(path)
        shown = reveal(str(target))
        folder = target.parent
        if target.exists() or target.is_symlink():
            raise Error(f"{shown} already exists; delete it first (nothing was written)")
        if not folder.is_dir():
            raise Error(f"the folder {reveal(str(folder))} does not exist; create it, or give a --path in an "
                        f"existing folder (nothing was written)")
        try:
            write_new(target, STARTER_POLICY)
        except FileExistsError:  # made between the check and the write
            raise Error(f"{shown} already exists; delete it first (nothing was written)") from None
        except OSError as exc:
            raise Error(f"{shown} could not be written ({exc.strerror or exc}); nothing was written") from None
        self.stdout.write(f"wrote {shown}")
        if self.console_script:
            store_folder = folder / ".ctrlrun"
            try:
                store_folder.mkdir(exist_ok=True)
            except OSError as exc:
                raise Error(f"wrote {shown}, but {reveal(str(store_folder))}/ could not be created "
                            f"({exc.strerror or exc})") from None
            self.stdout.write(f"created {reveal(str(store_folder))}/")
            self.stdout.write("")
            self.stdout.write(f"Next: edit {shown} to list your agent's actions, then protect the function "
                              f"that acts:")
            self.stdout.write('    @ctrlrun.protect("stripe.refund")')
            self.stdout.write("The first protected call makes the store in .ctrlrun/; 'ctrlrun receipts' lists "
                              "what it recorded.")
            return
        self.stdout.write("The store is this project's database (no .ctrlrun/ folder is made): run "
                          f"'{self.command_line('migrate')}' if you have not.")
        self.stdout.write("")
        self.stdout.write(f"Next: edit {shown} to list your agent's actions, point the settings at it:")
        self.stdout.write(f"    {SETTINGS_SNIPPET}")
        self.stdout.write('then protect the function that acts: @ctrlrun.protect("stripe.refund").')
