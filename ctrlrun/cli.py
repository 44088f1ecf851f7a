"""The ``ctrlrun`` console script: this app's management commands on the standalone store.

``ctrlrun receipts`` is ``python manage.py receipts`` for a plain script's folder: the store is
found as a protected call finds it (``$CTRLRUN_STORE_URL``/``$DATABASE_URL``, else
``$CTRLRUN_STATE``, else ``.ctrlrun/state.db`` beside ``./ctrlrun.yaml``). Commands that only read
or resolve never create a store.
"""
from __future__ import annotations

import os
import sys

from typing import NoReturn

from . import __version__
from .errors import CTRLRunError

#: The exit status when the reader of a command's output went away ('ctrlrun receipts | head -1'):
#: 128 + SIGPIPE, what the shell reports for cat, git or yes in the same pipe. Not 0 (the output
#: was cut short: a '--verify-chain' that could not say everything must not look like success),
#: and not 1 or 2, which say the chain is broken or the command line is wrong. (Help and the
#: version cut short exit 0: the reader had what it asked for.)
BROKEN_PIPE_STATUS = 141
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports Ctrl-C
VERSION = f"ctrlrun, version {__version__}"

#: command -> (creates the store if missing?, one-line summary)
COMMANDS: dict[str, tuple[bool, str]] = {
    "receipts": (False, "list receipts, or verify their hash chain (--verify-chain [--incremental])"),
    "effects": (False, "list effect records and their states"),
    "inspect": (False, "show one action's decision, effect, receipts and events (--grant ID: its budgets)"),
    "resolve": (False, "say what happened to an AMBIGUOUS effect (--committed or --failed)"),
    "approvals": (False, "list approval requests (pending first)"),
    "approve": (False, "grant a pending approval request (--by NAME, --note TEXT)"),
    "deny": (False, "deny a pending approval request"),
    "reconcile": (False, "sweep lapsed leases and ask reconcile hooks about AMBIGUOUS effects"),
    "resume_runs": (False, "resume agent runs paused on answered approvals (--once, --limit N, --import MODULE)"),
    "delegate": (True, "delegate a narrower grant from a delegable one (--parent ID --file GRANT.yaml --as AGENT)"),
    "delegations": (False, "list delegations: parent, agent, limits, expiry, revoked (--agent, --active, --json)"),
    "revoke": (False, "revoke a delegation and everything beneath it (ID, or --created-by / --under)"),
    "policy": (True, "propose a candidate policy for approval, or replay receipts under it (propose|replay --file)"),
    "prune": (False, "delete old receipts behind a signed checkpoint (--through SEQ --older-than 90d --by --reason)"),
    "hold": (False, "legal holds on receipt ranges: a held range is never pruned (place|release|list)"),
    "anchor": (False, "record the chain head outside the store, or --verify the store against it"),
    "import": (True, "import a store the reference ctrlrun wrote: its receipts v1-v7 verified first (--dry-run)"),
    "stats": (False, "count what the receipts of a time window say (--since 24h, --json)"),
    "verify": (False, "grade this deployment against the guarantees G1-G32 and X1-X4 (--json, --only, --junit FILE)"),
    "init": (False, "write a commented starter ctrlrun.yaml and create .ctrlrun/ beside it"),
    "demo": (False, "run the guided scenarios in a scratch store"),
    "scan": (False, "find consequential calls nothing protects (--coverage: actions no receipt names)"),
    "gateway": (True, "serve an MCP gateway: every tools/call of --upstream a protected call (needs the mcp extra)"),
    "mcp-operator": (False, "answer approvals and resolve AMBIGUOUS effects from an MCP client (needs the mcp extra)"),
}

#: Console-script names whose management command is called something else (``manage.py init``
#: would be too generic a name inside a project).
COMMAND_MODULES = {"init": "ctrlrun_init", "import": "import_store", "gateway": "mcp_gateway", "mcp-operator": "mcp_operator"}

#: Commands that never open a store: the console script configures Django without one.
NO_STORE = ("demo", "init")


def _usage() -> str:
    lines = ["usage: ctrlrun COMMAND [options]   (ctrlrun COMMAND --help for each)", "", "commands:"]
    lines += [f"  {name:<11} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "The store: $CTRLRUN_STORE_URL or $DATABASE_URL, else $CTRLRUN_STATE, else .ctrlrun/state.db",
              "beside the policy ($CTRLRUN_CONFIG, else ./ctrlrun.yaml)."]
    return "\n".join(lines)


def stop_for_closed_pipe() -> NoReturn:
    """Stop quietly because stdout's reader went away: no traceback, exit ``BROKEN_PIPE_STATUS``.

    What is still buffered goes to /dev/null (Python would otherwise fail again flushing it at
    exit, and print 'Exception ignored ... BrokenPipeError')."""
    _quiet_stdout()
    raise SystemExit(BROKEN_PIPE_STATUS)


def _quiet_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. A closed pipe ('| head') ends it quietly with 141."""
    try:
        try:
            status = _main(argv)
            sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
        except BrokenPipeError:
            stop_for_closed_pipe()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:  # a command that does not catch Ctrl-C itself: its open step rolled back
        print("interrupted: ctrlrun stopped", file=sys.stderr)
        return INTERRUPTED_STATUS
    return status


def _scan_store(arguments: list[str]) -> None:
    """``scan --store-url URL`` (or ``--store-url=URL``): the store ``--coverage`` reads, as $CTRLRUN_STORE_URL."""
    for n, argument in enumerate(arguments):
        if argument == "--store-url" and n + 1 < len(arguments):
            os.environ["CTRLRUN_STORE_URL"] = arguments[n + 1]
        elif argument.startswith("--store-url="):
            os.environ["CTRLRUN_STORE_URL"] = argument.split("=", 1)[1]


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help", "--version"):
        # Help and the version, as argparse prints them for each command: a reader that stopped
        # early ('--help | head -2') took what it wanted, so this is no failure (exit 0, quietly).
        try:
            print(VERSION if argv and argv[0] == "--version" else _usage())
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"Error: no command {name!r}; the commands are {', '.join(COMMANDS)} (ctrlrun --help)", file=sys.stderr)
        return 2
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # so 'reconcile --import my_tools' finds the folder's modules
    wants_help = any(arg in ("-h", "--help", "--version") for arg in argv[1:])  # needs no store
    try:
        from . import standalone

        if name == "scan":  # reads source; only --coverage reads a store (--store-url URL names it)
            _scan_store(argv[1:])
        if wants_help or name in NO_STORE or (name == "scan" and "--coverage" not in argv[1:]):
            standalone.configure_without_store()
        else:
            # (policy replay only reads: like the read-only commands, it never creates a store)
            creates = COMMANDS[name][0] and not (name == "policy" and argv[1:2] == ["replay"])
            standalone.configure(create=creates, command=name)
    except KeyboardInterrupt:  # Ctrl-C while Django sets up: no store was touched yet
        print(f"interrupted: ctrlrun {name} did not start (no command step had begun)", file=sys.stderr)
        return INTERRUPTED_STATUS
    except CTRLRunError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        # scan's exit 1 says it found something, verify's that a guarantee failed: for them, a store or
        # policy they cannot use is 2
        return 2 if name in ("scan", "verify") else 1
    from django.core.management import load_command_class

    command = load_command_class("ctrlrun", COMMAND_MODULES.get(name, name))
    command.console_script = True  # its own options only, and messages that say 'ctrlrun ...'
    try:
        command.run_from_argv(["ctrlrun", name, *argv[1:]])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
