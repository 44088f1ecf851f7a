from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from ... import scan as finder
from ...display import dumps, reveal
from ...errors import CTRLRunError
from ...scan_report import coverage, scan_document, scan_text
from ..base import CtrlrunCommand, Error

#: ``--vocabulary`` given with no file: print the vocabulary in use and stop.
PRINT_VOCABULARY = ""


class Command(CtrlrunCommand):
    help = ("Find consequential call sites nothing protects, by reading the source (never importing it): calls "
            "whose name holds a consequence verb (refund, delete, deploy, send, ...) or that write over HTTP, "
            "outside protected code; protected names the policy lacks; policy actions that can act without an "
            "effect template; files that cannot be parsed. Exit 0 when nothing is found, 1 for any finding, "
            "suppressed finding or undetermined call, 2 when the scan could not run. A finder, not a proof.")
    needs_store = False  # only --coverage reads the store

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--path", default=".", metavar="DIR", help="the folder (or one file) to scan (default: .)")
        parser.add_argument("--policy", metavar="FILE",
                            help="the policy to compare with (default: the configured one, when there is one)")
        parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                            help="leave out paths matching GLOB (relative to --path, or a file or folder name); repeat")
        parser.add_argument("--vocabulary", nargs="?", const=PRINT_VOCABULARY, metavar="FILE",
                            help="the consequence verbs, one a line, instead of the built-in 25; with no FILE, print "
                                 "the vocabulary in use (a file to start from) and stop")
        parser.add_argument("--json", action="store_true", help="print the ctrlrun.scan/v1 document")
        parser.add_argument("--coverage", action="store_true",
                            help="also list policy actions and protected names no receipt names (reads the store)")
        parser.add_argument("--store-url", metavar="URL",
                            help="the store --coverage reads (ctrlrun scan only; inside a project it is the project's "
                                 "database)")

    def run(self, *, path: str, policy: str | None, exclude: list[str], vocabulary: str | None, json: bool,
            coverage: bool, store_url: str | None, **_: Any) -> None:
        verbs, source = self._vocabulary(vocabulary)
        if vocabulary == PRINT_VOCABULARY:
            self.stdout.write("\n".join(verbs))
            return
        if store_url is not None and not self.console_script:
            raise Error("--store-url is for 'ctrlrun scan'; inside a project --coverage reads the project's database "
                        "(DATABASES, e.g. from DATABASE_URL)", returncode=2)
        if store_url is not None and not coverage:
            raise Error("--store-url only goes with --coverage (it names the store whose receipts are read)",
                        returncode=2)
        root = Path(path)
        if not root.exists():
            raise Error(reveal(f"--path {path}: no such file or folder"), returncode=2)
        loaded, policy_file = self._policy(policy)

        def progress(count: int) -> None:
            self.stderr.write(f"scan: {count} files read…")

        result = finder.scan(root, vocabulary=verbs, exclude=exclude, policy=loaded, policy_file=policy_file,
                             progress=progress)
        covered = self._coverage(loaded, result, policy_file) if coverage else None
        document = scan_document(result, vocabulary=verbs, vocabulary_source=source, policy=loaded,
                                 policy_file=policy_file, coverage_document=covered)
        if json:
            self.stdout.write(dumps(document, indent=2))
        else:
            self.stdout.write("\n".join(scan_text(document)))
        if result.exit_code:
            total = len(result.findings) + len(result.suppressed) + len(result.undetermined)
            raise Error(f"scan found {total} call site(s) or entries to look at (findings, suppressed, undetermined)",
                        returncode=1)

    def _vocabulary(self, given: str | None) -> tuple[tuple[str, ...], str]:
        if not given:
            return finder.VOCABULARY, "built-in"
        try:
            text = Path(given).read_text(encoding="utf-8")
            return finder.read_vocabulary(text), given
        except (OSError, UnicodeError, ValueError) as exc:
            raise Error(reveal(f"--vocabulary {given}: {exc}; write one verb a line "
                               f"('{self.command_line('scan')} --vocabulary' prints the built-in list)"),
                        returncode=2) from None

    def _policy(self, given: str | None) -> tuple[Any, str | None]:
        from ...control import Control

        if given is not None:
            try:  # a file of the user's choosing, read as a Control reads one (the one reader of policies)
                return Control.from_file(given).read_policy(), given
            except CTRLRunError as exc:
                raise Error(reveal(f"--policy {given}: {exc}", multiline=True), returncode=2) from None
        from ... import conf

        configured = conf.policy_path()
        if not configured.exists():
            return None, None  # no policy here: the source alone is scanned
        try:
            return self.load_policy(), str(configured)
        except Error as exc:
            raise Error(str(exc), returncode=2) from None

    def _coverage(self, policy: Any, result: finder.ScanResult, policy_file: str | None) -> dict[str, Any]:
        import datetime as dt

        from ... import store

        from django.db import Error as DatabaseError

        self.require_store()
        try:
            documents = store.receipt_documents_since(dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc))
            return coverage(policy, result.protected, documents, policy_file=policy_file)
        except (CTRLRunError, DatabaseError) as exc:
            raise Error(reveal(f"--coverage: the store's receipts could not be read ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())})"), returncode=2) from None
