"""Every example in README.md and docs/*.md, run as written, and every link there followed.

The convention (docs/development.md, "Examples in the docs", says the same for writers):

- Each page gets one fresh scratch folder; its fenced blocks are taken in order, in that folder.
- ```` ```python ````: a complete script, run with this Python (``-c``, cwd the scratch folder,
  ``PYTHONPATH`` the repository root); it must exit 0 within 300 s.
- ```` ```<lang> file=NAME ````: written to NAME in the scratch folder for the blocks after it;
  not run (a ``yaml`` one must parse, a ``python`` one must compile).
- ```` ```console ```` / ```` ```sh ```` (also ``bash``, ``shell``): each line starting with ``$ `` is
  a command; the block's commands run one after another in one bash, in the scratch folder, the
  venv's bin first on PATH; every one must exit 0, and the last one N when the info string says
  ``exit=N``. Other lines are output shown, not compared. Such a block with no ``$ `` line fails.
- ```` ```sh newcomer ````: the README's two commands for a newcomer (they make a virtualenv and
  pip-install): not run here, but they must be exactly the two commands CI runs (``.ci/run``).
- ```` ```python fragment ````: a piece of a file (a settings.py addition, an app's receivers): it
  is still an example, so it is run through the setup named by an HTML comment on the line before
  its fence, ``<!-- docs-test: setup=NAME -->`` (``SETUPS`` below: a fresh Django project around it,
  real calls producing the events it reads), or it says why it cannot run,
  ``<!-- docs-test: not run: REASON -->`` (then it must compile). A fragment with neither fails.
- ```` ```python file=NAME ````: must be used by a later block of its page (``import`` of its module,
  or its name on a command line), or carry one of those comments.
- A ``yaml`` block without ``file=`` must parse. Any other language (``text``, ``html+django``,
  ``json``) is shown, not run.

Examples run against the embedded SQLite store in their scratch folder: the environment loses
``DJANGO_SETTINGS_MODULE``, ``DATABASE_URL`` and every ``CTRLRUN_*`` variable, then gets the
tests' ``CTRLRUN_SIGNING_KEY`` and ``SECRET_KEY`` back. Each block is its own test id
(``docs/policy.md:12``, the line of its opening fence), so a failure names the block.

Links: every relative link and image in those pages must name a file that exists, and every
``#anchor`` a heading of the page it points into (GitHub's anchors). ``PENDING_PAGES`` are docs
pages being written on other branches at the same time; a link to one passes while it is missing.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support import REPO

pytestmark = pytest.mark.slow

#: Generous: a block of five `ctrlrun` commands took over 120 s on a shared two-core machine under load
#: (load average 20, two xdist workers); a hang still fails, only later.
TIMEOUT = 300
SHELLS = {"console", "sh", "bash", "shell"}
OPTIONS = {"fragment", "newcomer"}
#: Pages the README's map links that other branches are writing now; remove a name once it exists.
PENDING_PAGES: set[str] = set()
#: The values tests/settings.py gives every process the tests start.
SIGNING_KEY = os.environ.get("CTRLRUN_SIGNING_KEY", "tests-only-signing-key-0123456789abcdef")
SECRET_KEY = os.environ.get("SECRET_KEY", "tests-only-secret-key")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


# --------------------------------------------------------------------------- reading the pages


@dataclass(frozen=True)
class Block:
    page: str
    line: int            # the opening fence's line, from 1
    lang: str
    options: dict[str, str]   # file=NAME, exit=N, and the bare words (fragment, newcomer) as ""
    text: str
    #: The ``<!-- docs-test: ... -->`` comment on the line before the fence: ``setup=NAME`` or
    #: ``not run: REASON`` ("" when there is none).
    marker: str = ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of a page (CommonMark fences: a closing fence of the same character, at
    least as long, nothing after it)."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening or (opening.group(2)[0] == "`" and "`" in opening.group(3)):
            i += 1
            continue
        indent, fence, info = len(opening.group(1)), opening.group(2), opening.group(3).strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if closing and closing.group(2)[0] == fence[0] and len(closing.group(2)) >= len(fence) \
                    and not closing.group(3).strip():
                break
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])  # the fence's indent off
            j += 1
        words = info.split()
        lang = words[0] if words else ""
        options = {}
        for word in words[1:]:
            key, _, value = word.partition("=")
            options[key] = value
        marked = MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(Block(name(page), i + 1, lang, options, "\n".join(body) + "\n",
                           marked.group(1) if marked else ""))
        i = j + 1
    return found


ALL_BLOCKS = [block for page in pages() for block in blocks_of(page)]


# --------------------------------------------------------------------------- running them


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL") and not k.startswith("CTRLRUN_")}
    env["CTRLRUN_SIGNING_KEY"] = SIGNING_KEY
    env["SECRET_KEY"] = SECRET_KEY
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def shell_script(block: Block) -> tuple[str, list[str]]:
    """The block's commands as one bash script that stops at the first failure but the last."""
    commands = [line[2:] for line in block.text.splitlines() if line.startswith("$ ")]
    assert commands, f"{block.id}: a {block.lang} block with no '$ ' command: mark it `text` if it is not run"
    script = []
    for number, command in enumerate(commands, 1):
        script.append(command)
        if number < len(commands):
            script.append(f'__status=$?; if [ "$__status" -ne 0 ]; then '
                          f'echo "command {number} exited $__status: "{shlex.quote(command)} >&2; '
                          f'exit 97; fi')
    return "\n".join(script) + "\n", commands


def output(result: subprocess.CompletedProcess) -> str:
    return f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


# --------------------------------------------------------------------------- setups of python fragments


def marked_setup(block: Block) -> str | None:
    """The setup a block's ``<!-- docs-test: ... -->`` comment names, or None (none, or ``not run: REASON``);
    a python fragment without either comment, or an unreadable comment, fails here."""
    marker = block.marker
    if not marker:
        assert not (block.lang == "python" and "fragment" in block.options), (
            f"{block.id}: a python fragment is an example too: name the setup that runs it on the line before "
            f"its fence (<!-- docs-test: setup=NAME -->, NAME one of {sorted(SETUPS)}), or say why it cannot "
            f"run (<!-- docs-test: not run: REASON -->)")
        return None
    assert block.lang == "python", f"{block.id}: a docs-test comment is for python blocks, not {block.lang!r}"
    if marker.startswith("setup="):
        setup = marker.removeprefix("setup=").strip()
        assert setup in SETUPS, f"{block.id}: no setup {setup!r}; the setups are {sorted(SETUPS)}"
        assert "fragment" in block.options, f"{block.id}: setup= is for a `python fragment` block"
        return setup
    reason = marker.removeprefix("not run:").strip()
    assert marker.startswith("not run:") and reason, (
        f"{block.id}: the docs-test comment says {marker!r}; write 'setup=NAME' or 'not run: REASON'")
    return None


def run_in(folder: Path, *command: str) -> subprocess.CompletedProcess:
    result = subprocess.run(list(command), cwd=folder, env=environment(), capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode} in {folder}\n{output(result)}"
    return result


def new_project(folder: Path, block: Block, settings: str = "", policy: str | None = None) -> Path:
    """A project made by ``django-admin startproject docsproject`` in its own folder beside the page's files,
    with ``policy`` as its ctrlrun.yaml (default: the page's own, copied in, as a project keeps it beside
    manage.py), ``settings`` then the block appended to its settings.py."""
    root = folder / f"project-{block.line}"
    root.mkdir()
    run_in(folder, sys.executable, "-m", "django", "startproject", "docsproject", str(root))
    if policy is None and (folder / "ctrlrun.yaml").exists():
        policy = (folder / "ctrlrun.yaml").read_text(encoding="utf-8")
    if policy is not None:
        (root / "ctrlrun.yaml").write_text(policy, encoding="utf-8")
    with (root / "docsproject" / "settings.py").open("a", encoding="utf-8") as out:
        out.write(f"\n{settings}\n# {block.id}\n{block.text}")
    return root


#: The README's lines that install ctrlrun in a project (README.md, "In a Django project").
CTRLRUN_INSTALLED = 'INSTALLED_APPS += ["ctrlrun"]\nUSE_TZ = True\n'


def settings_setup(block: Block, folder: Path) -> None:
    """``setup=settings``: the block is an addition to a new project's settings.py; the project must then
    pass ``manage.py check`` and migrate."""
    root = new_project(folder, block)
    run_in(root, sys.executable, "manage.py", "check")
    run_in(root, sys.executable, "manage.py", "migrate", "-v", "0")


def ctrlrun_settings_setup(block: Block, folder: Path) -> None:
    """``setup=ctrlrun-settings``: as ``settings``, in a project that already has ctrlrun installed and a
    policy of its own (the page's ctrlrun.yaml may be a broken one it shows an error with)."""
    root = new_project(folder, block, CTRLRUN_INSTALLED, RECEIVER_POLICY)
    run_in(root, sys.executable, "manage.py", "check")
    run_in(root, sys.executable, "manage.py", "migrate", "-v", "0")


RECEIVER_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 50000 }
        decision: allow
      - when: { amount_lte: 1000000 }
        decision: approve
      - decision: deny
"""

#: Real calls that send every ctrlrun signal, run in the project with ``manage.py shell -c``: it fails when
#: a receiver raised (send_robust only logs it) or when a signal the block listens to was never sent.
RECEIVER_CALLS = """\
import logging
import weakref

from django.core import mail

import ctrlrun
from ctrlrun import signals, store
from ctrlrun.control import default_control
from yourapp import receivers

failed = []


class Failures(logging.Handler):
    def emit(self, record):
        failed.append(record.getMessage())


logging.getLogger("ctrlrun.observers").addHandler(Failures(logging.ERROR))


def target(entry):
    ref = entry[1]
    return ref() if isinstance(ref, weakref.ReferenceType) else ref


listened = [name for name in signals.__all__
            if any(getattr(target(entry), "__module__", None) == receivers.__name__
                   for entry in getattr(signals, name).receivers)]
sent = set()
for name in listened:
    getattr(signals, name).connect(lambda sender, name=name, **kwargs: sent.add(name), weak=False)

control = default_control()
try:
    control.call("stripe.refund", {"payment_id": "t1", "amount": 200000}, lambda: "refunded", principal="agent")
except ctrlrun.ApprovalRequired as asked:
    store.answer_approval(asked.request_id, True, by="alice")


def lost():
    raise TimeoutError("the reply was lost")


try:
    control.call("stripe.refund", {"payment_id": "t2", "amount": 10}, lost, principal="agent")
except TimeoutError:
    pass
store.resolve("refund:t2", "committed", by="alice", reason="the refund is in the remote")
try:
    control.call("stripe.refund", {"payment_id": "t3", "amount": 9000000}, lambda: None, principal="agent")
except ctrlrun.ActionDenied:
    pass
assert listened, "the block connects no receiver to a ctrlrun signal"
assert not failed, "a receiver raised: " + " | ".join(failed)
assert sent == set(listened), ("never sent", set(listened) - sent)
for message in mail.outbox:
    print(message.subject)
"""


def receivers_setup(block: Block, folder: Path) -> None:
    """``setup=signal-receivers``: the block is ``yourapp/receivers.py``, imported by the app's ready(), in a
    project with ctrlrun and that app installed, ADMINS set and Django's in-memory mail; real calls then
    send every signal (a call that asks a person and is granted, a lost reply later resolved, a denied
    call), and no receiver may raise."""
    root = new_project(folder, block, policy=RECEIVER_POLICY)
    settings = root / "docsproject" / "settings.py"
    text = settings.read_text(encoding="utf-8").replace(f"# {block.id}\n{block.text}", "")
    settings.write_text(text + CTRLRUN_INSTALLED + (
        'INSTALLED_APPS += ["yourapp"]\n'
        'ADMINS = [("Ops", "ops@example.com")]\n'
        'EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"\n'
        'CTRLRUN_POLICY = BASE_DIR / "ctrlrun.yaml"\n'), encoding="utf-8")
    app = root / "yourapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "apps.py").write_text("from django.apps import AppConfig\n\n\nclass YourAppConfig(AppConfig):\n"
                                 "    name = 'yourapp'\n\n    def ready(self):\n"
                                 "        from . import receivers  # noqa: F401\n")
    (app / "receivers.py").write_text(block.text, encoding="utf-8")
    run_in(root, sys.executable, "manage.py", "migrate", "-v", "0")
    result = run_in(root, sys.executable, "manage.py", "shell", "-c", RECEIVER_CALLS)
    assert result.stdout.strip(), f"{block.id}: the receivers sent no mail\n{output(result)}"


#: What a ``<!-- docs-test: setup=NAME -->`` comment may name.
SETUPS = {"settings": settings_setup, "ctrlrun-settings": ctrlrun_settings_setup,
          "signal-receivers": receivers_setup}


def check(block: Block, folder: Path) -> None:
    """Do what the convention says with one block, in its page's scratch folder."""
    unknown = set(block.options) - OPTIONS - {"file", "exit"}
    assert not unknown, f"{block.id}: unknown option(s) {sorted(unknown)} in the info string"
    setup = marked_setup(block)
    if "file" in block.options:
        target = block.options["file"]
        assert target and not Path(target).is_absolute() and ".." not in Path(target).parts, block.id
        if block.lang == "yaml":
            yaml.safe_load(block.text)
        if block.lang == "python":
            compile(block.text, f"{block.id} ({target})", "exec")
        (folder / target).parent.mkdir(parents=True, exist_ok=True)
        (folder / target).write_text(block.text, encoding="utf-8")
        return
    if block.lang == "python" and "fragment" in block.options:
        compile(block.text, block.id, "exec")
        if setup is not None:
            SETUPS[setup](block, folder)
        return
    if block.lang == "python":
        result = subprocess.run([sys.executable, "-c", block.text], cwd=folder, env=environment(),
                                capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode == 0, f"{block.id} exited {result.returncode}\n{output(result)}"
        return
    if block.lang in SHELLS and "newcomer" in block.options:
        return  # test_the_newcomer_commands_are_the_ones_ci_runs
    if block.lang in SHELLS:
        script, commands = shell_script(block)
        expected = int(block.options.get("exit") or 0)
        result = subprocess.run(["bash", "-c", script], cwd=folder, env=environment(),
                                capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode != 97 or len(commands) == 1, f"{block.id}: {output(result)}"
        assert result.returncode == expected, \
            f"{block.id}: the last command exited {result.returncode}, not {expected}\n{output(result)}"
        return
    if block.lang == "yaml":
        yaml.safe_load(block.text)


#: page -> (scratch folder, how many of its blocks were done)
_progress: dict[str, list] = {}


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_example(block: Block, tmp_path_factory):
    """The block, after the page's blocks before it (done once each, in order, whatever -k chose)."""
    own = [b for b in ALL_BLOCKS if b.page == block.page]
    if block.page not in _progress:
        _progress[block.page] = [tmp_path_factory.mktemp(block.page.replace("/", "-")), 0]
    state = _progress[block.page]
    folder, index = state[0], own.index(block)
    while state[1] < index:
        earlier = own[state[1]]
        state[1] += 1
        try:
            check(earlier, folder)
        except AssertionError as exc:
            pytest.fail(f"an earlier block of the page failed first: {exc}")
    if state[1] == index:
        state[1] += 1
        check(block, folder)


PYTHON_FILES = [b for b in ALL_BLOCKS if b.lang == "python" and "file" in b.options and not b.marker]


@pytest.mark.parametrize("block", PYTHON_FILES, ids=[b.id for b in PYTHON_FILES])
def test_a_python_file_is_used_by_a_later_block(block):
    """A ``python file=NAME`` block is written, not run: a later block of its page must run it (import its
    module, or name the file on a command line), or it says why not (``<!-- docs-test: not run: ... -->``)."""
    target = block.options["file"]
    module = Path(target).with_suffix("").as_posix().replace("/", ".")
    later = [b.text for b in ALL_BLOCKS if b.page == block.page and b.line > block.line]
    uses = re.compile(rf"(^|\s)(import|from)\s+{re.escape(module)}\b|--import\s+{re.escape(module)}\b|"
                      rf"(^|[\s/]){re.escape(Path(target).name)}\b", re.M)
    assert any(uses.search(text) for text in later), (
        f"{block.id}: {target} is written but no later block of {block.page} imports or runs it: use it, or "
        f"mark it <!-- docs-test: not run: REASON -->")


# --------------------------------------------------------------------------- the newcomer's commands


def ci_commands() -> tuple[list[str], list[str]]:
    """(CI's test command, CI's demo command), as shell words, read from .ci/run."""
    ci = (REPO / ".ci" / "run").read_text()
    test = re.search(r"^run_suite bash -c '([^']+)'$", ci, re.M)
    demo = re.search(r"^(\S+ manage\.py demo)\b", ci, re.M)
    assert test and demo, ".ci/run no longer runs the suite through 'run_suite bash -c' or the demo"
    return shlex.split(test.group(1)), shlex.split(demo.group(1))


def steps(words: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            out.append([])
        else:
            out[-1].append(word)
    return out


def test_the_newcomer_commands_are_the_ones_ci_runs():
    """The README has exactly two `sh newcomer` blocks, one command each: the test command CI runs
    word for word, and the demo CI runs, after the same install without the test extras."""
    newcomer = [b for b in ALL_BLOCKS if "newcomer" in b.options]
    assert [b.page for b in newcomer] == ["README.md", "README.md"], [b.id for b in newcomer]
    commands = [b.text.strip() for b in newcomer]
    assert all("\n" not in c for c in commands), commands
    ci_test, ci_demo = ci_commands()
    demo, test = (shlex.split(c) for c in commands)
    assert test == ci_test, (test, ci_test)
    *demo_install, demo_run = steps(demo)
    *test_install, _ = steps(ci_test)
    assert demo_run == ci_demo, (demo_run, ci_demo)
    without_extras = [["." if word == ".[test]" else word for word in step] for step in test_install]
    assert demo_install == without_extras, (demo_install, without_extras)


# --------------------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*_]{1,2}([^*_]+)[*_]{1,2}", r"\1", text).strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return kept.replace(" ", "-")


def prose(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced blocks, inline code removed."""
    fenced = set()
    for block in blocks_of(page):
        fenced.update(range(block.line, block.line + block.text.count("\n") + 2))
    return [(n, re.sub(r"`[^`]*`", "", line))
            for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if n not in fenced]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes for the page's headings (a repeated one gets -1, -2 …)."""
    seen: dict[str, int] = {}
    out = set()
    outside = {n for n, _ in prose(page)}
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading or n not in outside:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links() -> list[tuple[str, int, str]]:
    found = []
    for page in pages():
        for n, line in prose(page):
            for target in LINK.findall(line):
                found.append((name(page), n, target))
    return found


def test_the_pages_have_links():
    assert len(links()) > 10


@pytest.mark.parametrize("page,line,target", links(), ids=[f"{p}:{n}:{t}" for p, n, t in links()])
def test_link_resolves(page, line, target):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return  # https:, mailto: — not followed here
    path, _, anchor = target.partition("#")
    source = REPO / page
    goal = (source.parent / path).resolve() if path else source
    relative = goal.relative_to(REPO).as_posix() if goal.is_relative_to(REPO) else str(goal)
    if not goal.exists() and relative in PENDING_PAGES:
        return
    assert goal.exists(), f"{page}:{line}: {target} names {relative}, which does not exist"
    if anchor:
        assert goal.suffix == ".md", f"{page}:{line}: an anchor into {relative}, not a Markdown page"
        assert anchor in anchors(goal), f"{page}:{line}: no heading of {relative} has the anchor #{anchor}"
