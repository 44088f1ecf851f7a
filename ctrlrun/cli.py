"""The ``ctrlrun`` console script: this app's management commands on the standalone store.

``ctrlrun receipts`` is ``python manage.py receipts`` for a plain script's folder: the store is
found as a protected call finds it (``$CTRLRUN_STORE_URL``/``$DATABASE_URL``, else
``$CTRLRUN_STATE``, else ``.ctrlrun/state.db`` beside ``./ctrlrun.yaml``). Commands that only read
or resolve never create a store.
"""
from __future__ import annotations

import os
import sys

from . import __version__
from .errors import CTRLRunError

#: command -> (creates the store if missing?, one-line summary)
COMMANDS: dict[str, tuple[bool, str]] = {
    "receipts": (False, "list receipts, or verify their hash chain (--verify-chain)"),
    "effects": (False, "list effect records and their states"),
    "inspect": (False, "show one action's decision, effect, receipts and events"),
    "resolve": (False, "say what happened to an AMBIGUOUS effect (--committed or --failed)"),
    "approvals": (False, "list approval requests (pending first)"),
    "approve": (False, "grant a pending approval request (--by NAME, --note TEXT)"),
    "deny": (False, "deny a pending approval request"),
    "reconcile": (False, "sweep lapsed leases and ask reconcile hooks about AMBIGUOUS effects"),
    "demo": (False, "run the guided scenarios in a scratch store"),
}


def _usage() -> str:
    lines = ["usage: ctrlrun COMMAND [options]   (ctrlrun COMMAND --help for each)", "", "commands:"]
    lines += [f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "The store: $CTRLRUN_STORE_URL or $DATABASE_URL, else $CTRLRUN_STATE, else .ctrlrun/state.db",
              "beside the policy ($CTRLRUN_CONFIG, else ./ctrlrun.yaml)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(f"ctrlrun, version {__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"Error: no command {name!r}; the commands are {', '.join(COMMANDS)} (ctrlrun --help)", file=sys.stderr)
        return 2
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # so 'reconcile --import my_tools' finds the folder's modules
    wants_help = any(arg in ("-h", "--help") for arg in argv[1:])
    try:
        from . import standalone

        if wants_help or name == "demo":  # the demo keeps a scratch store of its own
            standalone.configure_without_store()
        else:
            standalone.configure(create=COMMANDS[name][0])
    except CTRLRunError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    from django.core.management import load_command_class

    command = load_command_class("ctrlrun", name)
    try:
        command.run_from_argv(["ctrlrun", name, *argv[1:]])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
