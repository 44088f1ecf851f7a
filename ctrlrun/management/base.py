"""What every ctrlrun command shares: one-line errors, never a traceback."""
from __future__ import annotations

import getpass
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from ..errors import CTRLRunError


class Error(CommandError):
    """Printed by Django as ``Error: <message>`` on stderr, with a non-zero exit."""


def positive_int(value: str) -> int:
    """An argparse type: a whole number of at least 1, with a message that says so."""
    import argparse

    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def default_person() -> str:
    """Who is at the keyboard: the operating-system user, for ``--by`` defaults."""
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (some containers): still name something real
        return f"uid:{os.getuid()}"


class CtrlrunCommand(BaseCommand):
    """A thin command: parse, call the store, print. Subclasses implement ``run``."""

    requires_system_checks: list[str] = []  # a malformed policy must not stop reading evidence

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self.run(**options)
        except CommandError:
            raise
        except BrokenPipeError:  # the reader went away (e.g. '| head'): stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            return
        except CTRLRunError as exc:
            raise Error(str(exc)) from None
        except UnicodeError as exc:
            raise Error(f"an argument is not valid UTF-8 text ({exc.reason}); check the id or key you typed") from None
        except DatabaseError as exc:
            raise Error(
                f"the ctrlrun store could not be read ({type(exc).__name__}: {str(exc).strip()}). If its tables "
                f"are missing, run 'python manage.py migrate'"
            ) from None

    def run(self, **options: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
