"""``verify``: grade this deployment against the guarantees (``ctrlrun.guarantees/v7``, G1-G32, and X1-X4).

Exit status: 0 every applicable check passes (and at least one applies); 1 a check FAILED; 2 the
configuration was refused or is unusable (observe mode, nothing applicable, an unknown ``--only`` id,
a policy that does not load); 3 an internal error (the report could not be made)."""
from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from ... import verify
from ...display import dumps, reveal
from ...errors import CTRLRunError
from ..base import CtrlrunCommand, Error


class Command(CtrlrunCommand):
    help = ("Grade this deployment's own configuration and store against the guarantees G1-G32 (and the port's "
            "X1-X4: the guard current, the signing key outside the database, the role unable to alter triggers, "
            "a recent intact chain check): pass, fail or not applicable, each with its reason. Read-only. "
            "Exit 0 all applicable pass, 1 one failed, 2 unusable configuration, 3 internal error.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the ctrlrun.verify/v1 document")
        parser.add_argument("--only", metavar="IDS", help="grade only these, comma-separated (G1,G3,X1); "
                            "the rest are 'skipped'")
        parser.add_argument("--junit", metavar="FILE", type=Path, help="also write the report as JUnit XML to FILE")

    def run(self, *, json: bool, only: str | None, junit: Path | None, **_: Any) -> None:
        try:
            selected = verify.parse_only(only)
            self.load_policy()  # a policy that does not load: one Error line
            document = verify.run(selected)
        except verify.Refused as exc:
            raise Error(reveal(str(exc)), returncode=2) from None
        except Error as exc:  # the policy did not load: unusable, not a failed guarantee
            raise Error(str(exc), returncode=2) from None
        except CTRLRunError as exc:  # the store unreachable, a setting that does not read
            raise Error(reveal(self.refusal(exc), multiline=True), returncode=2) from None
        except Exception as exc:  # noqa: BLE001 - exit 3, one line, never a traceback
            raise Error(f"verify could not make its report ({type(exc).__name__}: {reveal(str(exc))})",
                        returncode=3) from None
        if junit is not None:
            try:
                junit.write_bytes(verify.junit(document))
            except OSError as exc:
                raise Error(f"--junit {junit}: cannot write the file ({exc.strerror}); give a writable path",
                            returncode=2) from None
        if json:
            self.stdout.write(dumps(document))
        else:
            for line in verify.lines(document):
                self.stdout.write(reveal(line))
        status = verify.exit_status(document)
        if status == 1:
            failed = [g["id"] for g in document["guarantees"] if g["status"] == verify.FAIL]
            raise Error(f"{len(failed)} check(s) failed: {', '.join(failed)}", returncode=1)
        if status == 2:
            raise Error("no selected guarantee applies to this configuration: nothing was graded", returncode=2)
