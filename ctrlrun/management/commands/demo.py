from __future__ import annotations

import os
import shutil
import subprocess
import sys
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

import ctrlrun

from ... import demo
from ..base import CtrlrunCommand, Error

MARKER = ".ctrlrun-demo"
#: Environment variables that would point the demo at a real store; it must use its own.
_STORE_VARIABLES = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG",
                    "CTRLRUN_ENVIRONMENT")


class Command(CtrlrunCommand):
    needs_store = False  # no store is opened
    help = (
        "Run the guided scenarios (a lost reply, a dropped connection, a duplicate, denials, a human "
        "approval, racing processes) in a scratch SQLite store, and say how many calls reached each stand-in remote."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--dir", default=".ctrlrun/demo", metavar="PATH",
                            help="scratch folder, recreated on every run (default: .ctrlrun/demo)")

    def run(self, *, dir: str, **_: Any) -> None:
        folder = Path(dir).absolute()
        if folder.exists():
            if not (folder / MARKER).exists():
                raise Error(f"{folder} exists and is not a ctrlrun demo folder; choose another --dir")
            shutil.rmtree(folder)  # only ever a folder this command made (it holds the marker)
        folder.mkdir(parents=True)
        (folder / MARKER).write_text("made by 'manage.py demo'; deleted and remade on every run\n")
        (folder / "ctrlrun.yaml").write_text(demo.POLICY)
        self.stdout.write(f"ctrlrun demo: a scratch store at {folder / '.ctrlrun' / 'state.db'}")
        self.stdout.write(f"policy: {folder / 'ctrlrun.yaml'}")
        env = {k: v for k, v in os.environ.items() if k not in _STORE_VARIABLES}
        package_parent = str(Path(ctrlrun.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        process = subprocess.Popen([sys.executable, "-m", "ctrlrun.demo", str(folder)], cwd=folder, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            self.stdout.write(line.rstrip("\n"))
        stderr = process.stderr.read() if process.stderr else ""
        if process.wait() != 0:
            raise Error(f"the demo stopped early:\n{stderr.strip()}")
        relative = os.path.relpath(folder)
        beside = Path(sys.executable).parent / "ctrlrun"
        cli = "ctrlrun" if shutil.which("ctrlrun") == str(beside) or not beside.exists() else str(beside)
        self.stdout.write("")
        self.stdout.write("To read the evidence it wrote:")
        self.stdout.write(f"  cd {relative} && {cli} receipts                 # one line per call, refusals included")
        self.stdout.write(f"  cd {relative} && {cli} receipts --verify-chain  # re-hash the chain")
        self.stdout.write(f"  cd {relative} && {cli} effects                  # one line per effect key")
