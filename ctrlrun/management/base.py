"""What every ctrlrun command shares: one-line errors, never a traceback."""
from __future__ import annotations

import argparse
import datetime as dt
import getpass
import logging
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DatabaseError  # InterfaceError too: it is not a DatabaseError

from .. import __version__
from ..cli import stop_for_closed_pipe
from ..display import reveal
from ..errors import CTRLRunError, StateConflict
from ..messages import state_conflict

#: The largest count a command accepts (``--last``, ``--limit``, ``--attempt``): the largest value
#: of a 64-bit signed integer, what SQLite and PostgreSQL (bigint, LIMIT) can hold.
MAX_COUNT = 2**63 - 1


class _UTCFormatter(logging.Formatter):
    """Log times as evidence shows them: ISO 8601 in UTC, to the millisecond (2026-12-02T09:15:00.120Z)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        when = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


#: A loop command's log line: ``2026-12-02T09:15:00.120Z INFO ctrlrun.reconcile: ...``.
LOOP_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _below_warning(record: logging.LogRecord) -> bool:
    return record.levelno < logging.WARNING


class Error(CommandError):
    """Printed by Django as ``Error: <message>`` on stderr, with a non-zero exit."""


def positive_int(value: str) -> int:
    """An argparse type: a whole number from 1 to ``MAX_COUNT``, with a message that says so.

    A larger number is a usage error here, not a database error later (the databases cannot
    hold it)."""
    try:
        number = int(value)
    except ValueError:  # also a number too long to read (more than 4300 digits)
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    if number > MAX_COUNT:
        given = str(number) if len(str(number)) <= 30 else f"a number of {len(str(number))} digits"
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT} (2**63 - 1), got {given}")
    return number


def span(delta: dt.timedelta) -> str:
    """A duration as people read it at a glance: 45s, 12m, 3h05m, 2d."""
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d"


def default_person() -> str:
    """Who is at the keyboard: the operating-system user, for ``--by`` defaults."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (some containers): still name something real
        return f"uid:{os.getuid()}"


class CtrlrunCommand(BaseCommand):
    """A thin command: parse, call the store, print. Subclasses implement ``run``."""

    requires_system_checks: list[str] = []  # a malformed policy must not stop reading evidence
    #: True when run by the ``ctrlrun`` console script (ctrlrun.cli), not by manage.py.
    console_script = False
    _prefix = "python manage.py"

    def command_line(self, name: str) -> str:
        """How the user runs command ``name`` here: ``ctrlrun effects`` or ``python manage.py effects``."""
        return f"{self._prefix} {name}"

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Django's parser, with a usage error on the command line as one ``Error: ...`` line and exit 2
        (argparse would print the whole usage block first).

        Under the console script only this command's own options are offered: Django's options for
        a project (``--settings``, ``--pythonpath``, ``--traceback``, ``--verbosity``,
        ``--force-color``) mean nothing for a plain script's store, so they are not listed, and are
        refused like any unknown option (``--settings nope`` silently ignored would be worse).
        ``--version`` prints ctrlrun's version (as ``ctrlrun --version`` does), unlisted; ``--no-color``
        stays. Under manage.py a command keeps Django's standard options (Django's convention)."""
        if self.console_script:
            self._prefix = "ctrlrun"
        elif os.path.basename(prog_name) == "django-admin":
            self._prefix = "django-admin"
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        if self.console_script:  # what Django's run_from_argv and execute read, without the options
            parser.set_defaults(verbosity=1, settings=None, pythonpath=None, traceback=False, force_color=False,
                                no_color=False, skip_checks=True)

        def error(message: str) -> None:
            if not parser.called_from_command_line:
                raise CommandError(f"Error: {message}")  # as Django's own, for call_command
            parser.exit(2, f"Error: {message} ('{parser.prog} --help' lists the options)\n")

        parser.error = error  # type: ignore[method-assign]
        return parser

    #: True for the loop commands (reconcile, resume_runs): ``-v/--verbosity`` is theirs under the
    #: console script too (``-v 2`` logs every idle pass), as under manage.py.
    keeps_verbosity = False

    def loop_logger(self, name: str, verbosity: int) -> logging.Logger:
        """The logger a loop command writes its passes to, at the level ``verbosity`` asks for (0: warnings
        only; 1, the default: a line when a pass did something; 2 and up: every pass, idle ones too).

        A logger the project's ``LOGGING`` gave handlers keeps them. Otherwise the command's own: INFO and
        DEBUG lines on stdout, warnings on stderr, each with its UTC time (``LOOP_LOG_FORMAT``), not
        propagated (the ``ctrlrun`` logger's handler would print them a second time, without the time)."""
        logger = logging.getLogger(name)
        logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
        if not logger.handlers:
            out = logging.StreamHandler(self.stdout)  # type: ignore[arg-type]
            out.addFilter(_below_warning)
            err = logging.StreamHandler(self.stderr)  # type: ignore[arg-type]
            err.setLevel(logging.WARNING)
            for handler in (out, err):
                handler.setFormatter(_UTCFormatter(LOOP_LOG_FORMAT))
                logger.addHandler(handler)
            logger.propagate = False
        return logger

    def add_base_argument(self, parser: CommandParser, *args: Any, **kwargs: Any) -> None:
        if self.keeps_verbosity and "--verbosity" in args:
            kwargs["help"] = ("what a loop logs: 0 warnings only, 1 (the default) a timestamped line for each pass "
                              "that did something, 2 or 3 every pass, idle ones too")
            super().add_base_argument(parser, *args, **kwargs)
        elif not self.console_script:
            super().add_base_argument(parser, *args, **kwargs)
        elif "--version" in args:
            parser.add_argument("--version", action="version", version=f"ctrlrun, version {__version__}",
                                help=argparse.SUPPRESS)
        elif "--no-color" in args:
            parser.add_argument("--no-color", action="store_true",
                                help="print errors without colour (on a terminal they are red)")
        # else: one of Django's options for a project; not offered by the console script

    #: False for the commands that open no store (``demo``, ``init``).
    needs_store = True

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if self.needs_store:
                self.require_store()
            self.run(**options)
        except CommandError:
            raise
        except BrokenPipeError:  # the reader went away (e.g. '| head'): stop quietly, exit 141
            stop_for_closed_pipe()
        except CTRLRunError as exc:  # messages quote names and keys: never print their hidden characters raw
            cause = exc.__cause__
            if isinstance(cause, DatabaseError) and self._never_connected():
                raise Error(reveal(self._unreachable(cause))) from None
            raise Error(reveal(self.refusal(exc), multiline=True)) from None
        except UnicodeError as exc:
            raise Error(f"an argument is not valid UTF-8 text ({exc.reason}); check the id or key you typed") from None
        except DatabaseError as exc:
            if self._never_connected():
                raise Error(reveal(self._unreachable(exc))) from None
            remedy = ("a protected call creates them" if self.console_script and self._standalone()
                      else f"run '{self._migrate()}'")
            raise Error(reveal(
                f"the ctrlrun store could not be read ({type(exc).__name__}: {' '.join(str(exc).split())}). If its tables "
                f"are missing, {remedy}"
            )) from None

    @staticmethod
    def _standalone() -> bool:
        from django.conf import settings

        return bool(getattr(settings, "CTRLRUN_STANDALONE", False))

    def _migrate(self) -> str:
        """How the project's migrate is run here (never 'ctrlrun migrate': there is none)."""
        return "python manage.py migrate" if self.console_script else self.command_line("migrate")

    @staticmethod
    def _connection() -> Any:
        from django.db import connections

        from .. import conf

        return connections[conf.database_alias()]

    def _never_connected(self) -> bool:
        """Did the database refuse the connection itself (no connection was ever made)?"""
        try:
            return self._connection().connection is None
        except Exception:  # an alias that is not configured: not a connection failure
            return False

    def _unreachable(self, exc: BaseException) -> str:
        """The database could not be reached: what the driver said, and what to check (not 'migrate')."""
        from ..standalone import describe_store

        where = "CTRLRUN_STORE_URL / DATABASE_URL / CTRLRUN_STATE" if self._standalone() else (
            "DATABASE_URL (or the settings' DATABASES)")
        return (f"the ctrlrun store's database ({describe_store()}) could not be reached ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())}). Check {where}: the host and port, the database name, the user "
                f"and password, and that the server is running; nothing ran")

    def require_store(self) -> None:
        """Inside a project, a SQLite store whose file is missing is refused before anything opens it
        (SQLite would create an empty file, and every command would then fail on missing tables).
        Standalone, ``ctrlrun.standalone.configure`` has already checked."""
        if self._standalone():
            return
        settings_dict = self._connection().settings_dict
        if not settings_dict.get("ENGINE", "").endswith("sqlite3"):
            return
        name = str(settings_dict.get("NAME") or "")
        if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
            return
        if not os.path.exists(name):
            from .. import conf

            raise Error(reveal(
                f"no database at '{name}' (settings.DATABASES[{conf.database_alias()!r}], e.g. from DATABASE_URL): a "
                f"ctrlrun command does not create one. Create the store with '{self._migrate()}', or check "
                f"DATABASE_URL"))

    def load_policy(self) -> Any:
        """The policy protected calls here use (the default Control's: ``CTRLRUN_POLICY``, else
        ``$CTRLRUN_CONFIG``, else ``./ctrlrun.yaml``), read without touching the store. A policy that
        does not load is one ``Error:`` line naming the problem (exit 1)."""
        from ..control import default_control

        try:
            # The read-only half of Control.load (which would also store the policy's row: a
            # command that only reads writes nothing).
            return default_control().read_policy()
        except CTRLRunError as exc:
            raise Error(reveal(f"the policy did not load, so its mode is unknown: {exc}", multiline=True)) from None

    def warn_if_observing(self, policy: Any) -> bool:
        """Say ``OBSERVE MODE — nothing is enforced`` on stderr when ``policy`` is in observe mode
        (every command that loads the policy does, before its output); True if it was."""
        from ..stats import OBSERVE_BANNER

        observing = policy.observing
        if observing:
            self.stderr.write(OBSERVE_BANNER)
        return observing

    def refusal(self, exc: CTRLRunError) -> str:
        """A refusal worded for this command line: a ``StateConflict`` (the store's facts) with the
        commands named as the user runs them here; any other error as it says itself."""
        return state_conflict(exc, self.command_line) if isinstance(exc, StateConflict) else str(exc)

    def run(self, **options: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
