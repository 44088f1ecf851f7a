"""The ``ctrlrun`` console script's options: its own, not Django's; and a reader that goes away.

``ctrlrun COMMAND`` runs this app's management commands on a plain script's store. Django's
options for a project (``--settings``, ``--pythonpath``, ``--traceback``, ``--verbosity``,
``--force-color``, Django's ``--version``) mean nothing there: they are refused as unknown options
(a usage error, exit 2, one line), and not listed. ``manage.py`` keeps them (Django's convention).

Every test runs the console script as an OS process, on a store a plain script made, through real
pipes.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ctrlrun
from ctrlrun.cli import COMMANDS
from tests.support import REPO, clean_env

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  audit.note:
    decision: allow
"""

#: Enough receipts that their lines (about 110 bytes each) are several times a pipe's buffer (64 KiB).
MANY = 2500

FILL = f"""
import ctrlrun

@ctrlrun.protect("audit.note")
def note(n: int) -> int:
    return n

with ctrlrun.context(agent="filler"):
    for n in range({MANY}):
        note(n=n)
"""

#: Django's options, which mean nothing for a plain script's store.
#: Commands that keep Django's -v/--verbosity under the console script (what their loop logs).
LOOP_COMMANDS = ("reconcile", "resume_runs")
DJANGO_OPTIONS = ["--settings", "--pythonpath", "--traceback", "--verbosity", "--force-color", "--skip-checks"]

#: 128 + SIGPIPE: what the shell reports for a program whose reader went away (cat, git, yes ...).
BROKEN_PIPE = 141


CTRLRUN = [sys.executable, "-m", "ctrlrun"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A plain script's folder whose store holds MANY receipts."""
    where = tmp_path_factory.mktemp("script")
    (where / "ctrlrun.yaml").write_text(POLICY)
    made = subprocess.run([sys.executable, "-c", FILL], cwd=where, env=clean_env(), capture_output=True, text=True,
                          timeout=600)
    assert made.returncode == 0, made.stderr
    return where


def ctrlrun_cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CTRLRUN, *args], cwd=folder, env=clean_env(), capture_output=True, text=True,
                          timeout=120)


def manage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=clean_env(), capture_output=True,
                          text=True, timeout=120)


def options_listed(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", help_text))


# --------------------------------------------------------------------------- versions


def test_ctrlrun_version_is_ctrlrun_s(folder):
    """`ctrlrun --version` and `ctrlrun receipts --version` both print ctrlrun's version, not Django's."""
    expected = f"ctrlrun, version {ctrlrun.__version__}\n"
    top = ctrlrun_cli(folder, "--version")
    assert (top.returncode, top.stdout, top.stderr) == (0, expected, "")
    for name in ("receipts", "effects", "reconcile", "demo"):
        sub = ctrlrun_cli(folder, name, "--version")
        assert (sub.returncode, sub.stdout, sub.stderr) == (0, expected, ""), name


# --------------------------------------------------------------------------- help: the command's own options


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_commands_help_lists_only_its_own_options_each_with_help(folder, name):
    """`ctrlrun COMMAND --help` lists no Django option, and every option it lists says what it does."""
    done = ctrlrun_cli(folder, name, "--help")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"usage: ctrlrun {name} ")
    listed = options_listed(done.stdout)
    # The loop commands keep -v/--verbosity: -v 2 logs their idle passes too (issue 25).
    refused = set(DJANGO_OPTIONS + ["--version"]) - ({"--verbosity"} if name in LOOP_COMMANDS else set())
    assert not listed & refused, sorted(listed & refused)
    assert "--no-color" in listed  # kept: errors are red on a terminal
    lines = done.stdout.split("\noptions:\n", 1)[1].splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("  -"):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        same_line = re.match(r"  \S.*?\s{2,}\S", line)
        next_line = following.startswith("   ") and not following.lstrip().startswith("-")
        assert same_line or next_line, f"{name}: {line.strip()!r} has no help text"


def test_manage_py_keeps_djangos_options():
    """Under manage.py a command keeps Django's standard options (that is Django's convention)."""
    done = manage("receipts", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--settings", "--pythonpath", "--traceback", "--verbosity", "--version"):
        assert option in done.stdout, option


# --------------------------------------------------------------------------- Django's options are refused


@pytest.mark.parametrize("arguments", [
    ["--settings", "nope"], ["--settings=nope"], ["--pythonpath", "/tmp"], ["--traceback"], ["-v", "2"],
    ["--verbosity", "0"], ["--force-color"], ["--skip-checks"],
])
def test_djangos_options_are_a_usage_error(folder, arguments):
    """`ctrlrun receipts --settings nope`: exit 2, one line naming the option, nothing on stdout."""
    done = ctrlrun_cli(folder, "receipts", *arguments)
    assert done.returncode == 2, (done.stdout[:200], done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: unrecognized arguments: ")
    assert arguments[0].split("=")[0] in lines[0]
    assert lines[0].endswith("('ctrlrun receipts --help' lists the options)")


def test_no_color_is_accepted(folder):
    """--no-color stays: a user of a terminal may want plain errors."""
    done = ctrlrun_cli(folder, "receipts", "--last", "1", "--no-color")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1


# --------------------------------------------------------------------------- a reader that goes away


def shell(command: str, folder: Path) -> subprocess.CompletedProcess:
    """Run ``command`` in bash with ``set -o pipefail``-free defaults; PIPESTATUS on its last line."""
    script = f'{command}; echo "status=${{PIPESTATUS[0]}}"'
    return subprocess.run(["bash", "-c", script], cwd=folder, env=clean_env(), capture_output=True, text=True,
                          timeout=120)


def test_help_into_head_raises_no_broken_pipe(folder):
    """`python -m ctrlrun --help | head -2`: two lines, nothing on stderr."""
    python = " ".join(CTRLRUN)
    done = shell(f"{python} --help | head -2", folder)
    *lines, status = done.stdout.splitlines()
    assert lines == ["usage: ctrlrun COMMAND [options]   (ctrlrun COMMAND --help for each)", ""]
    assert done.stderr == ""
    assert status == "status=0"


def test_receipts_into_head_stops_quietly(folder):
    """`ctrlrun receipts | head -1` with thousands of receipts: one line, no traceback, status 141."""
    python = " ".join(CTRLRUN)
    done = shell(f"{python} receipts | head -1", folder)
    *lines, status = done.stdout.splitlines()
    assert len(lines) == 1 and "audit.note" in lines[0]
    assert done.stderr == ""
    assert status == f"status={BROKEN_PIPE}"


@pytest.mark.parametrize("arguments, status", [
    (["receipts"], BROKEN_PIPE), (["receipts", "--json"], BROKEN_PIPE), (["effects"], BROKEN_PIPE),
    # Help and the version: the reader had what it asked for (argparse's own choice for each command).
    (["--help"], 0), (["--version"], 0), (["receipts", "--help"], 0), (["receipts", "--version"], 0),
])
def test_a_reader_gone_before_the_first_line(folder, arguments, status):
    """The pipe's reader is gone before anything is written: no traceback; a command's output cut
    short exits 141 (128 + SIGPIPE, as cat or git would), help or the version 0."""
    read_end, write_end = os.pipe()
    process = subprocess.Popen([*CTRLRUN, *arguments], cwd=folder, env=clean_env(), stdout=write_end,
                               stderr=subprocess.PIPE)
    os.close(write_end)
    os.close(read_end)  # before the process (still starting Python) writes a byte
    _, stderr = process.communicate(timeout=120)
    assert stderr.decode() == "", stderr.decode()
    assert process.returncode == status


def test_a_reader_that_leaves_after_one_line(folder):
    """A reader that takes one line of `ctrlrun receipts` and closes: the command stops quietly."""
    process = subprocess.Popen([*CTRLRUN, "receipts"], cwd=folder, env=clean_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == BROKEN_PIPE
    assert b"audit.note" in first
    assert stderr == b"", stderr.decode()


def test_manage_py_receipts_into_a_closed_pipe(folder):
    """The same under manage.py (the commands share the handling): no traceback."""
    env = clean_env()
    env["DATABASE_URL"] = f"sqlite:///{folder / '.ctrlrun' / 'state.db'}"
    env["CTRLRUN_SIGNING_KEY"] = (folder / ".ctrlrun" / "signing.key").read_text().strip()
    read_end, write_end = os.pipe()
    process = subprocess.Popen([sys.executable, "manage.py", "receipts"], cwd=REPO, env=env, stdout=write_end,
                               stderr=subprocess.PIPE)
    os.close(write_end)
    os.close(read_end)
    _, stderr = process.communicate(timeout=120)
    assert stderr.decode() == "", stderr.decode()
    assert process.returncode == BROKEN_PIPE


def test_ctrl_c_while_the_store_opens_is_a_line_not_a_traceback(folder, monkeypatch, capsys):
    """Ctrl-C before a command has started (Django still setting up) ends with 130 and one line."""
    from ctrlrun import cli, standalone

    def interrupted(**_options):
        raise KeyboardInterrupt

    monkeypatch.chdir(folder)
    monkeypatch.setattr(standalone, "configure", interrupted)
    assert cli.main(["receipts"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted: ctrlrun receipts did not start (no command step had begun)", err
