"""Hostile policy files, end to end: ``manage.py check`` and the first protected call of a plain
script refuse each one with the same one-line PolicyError naming the file and the line, in
bounded time and memory.

Every process runs under a 1 GiB address-space limit and a timeout, so a loader that expands an
alias bomb fails the test (MemoryError, a traceback, or the timeout) instead of exhausting the
machine.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.slow

#: The address space each process may use: Django and a policy of the maximum size fit in a
#: fraction of it; expanding a bomb does not (it took 7 GB).
MEMORY_LIMIT_BYTES = 1 << 30
#: A bound on a whole process (interpreter, Django, the store's migrations, the refusal), only
#: there so a regression fails instead of hanging.
PROCESS_TIMEOUT_SECONDS = 120
#: The refusal itself, timed inside the script around the first protected call.
REFUSAL_SECONDS = 5.0

V2 = "schema: ctrlrun.policy/v2\n"
REFUND = V2 + """\
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
  audit.note:
    decision: allow
"""


def list_bomb(levels: int = 9, width: int = 9) -> str:
    """A 650-byte "billion laughs" inside a valid rule: an `in` operand whose items are
    nested aliases of lists, 9**8 items once expanded (what the value check, the plain copy and
    the hash would all walk)."""
    lines = [V2 + "actions:", "  audit.note:", "    rules:", "      - decision: allow", "        when:",
             "          n_in:", '            - &a0 ["lol"]']
    for level in range(1, levels):
        lines.append(f"            - &a{level} [{', '.join([f'*a{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def nested_merge_bomb(levels: int = 9, width: int = 9) -> str:
    """The merge-key variant: each mapping merges ``<<: [*m, *m, ...]`` of the one before."""
    lines = [V2 + "actions: {audit.note: {decision: allow}}", "m0: &m0 {k0: lol}"]
    for level in range(1, levels):
        merged = ", ".join([f"*m{level - 1}"] * width)
        lines.append(f"m{level}: &m{level} {{<<: [{merged}], k{level}: lol}}")
    return "\n".join(lines) + "\n"


def wide_merge_bomb(keys: int = 5000, mappings: int = 10000) -> str:
    """Merge keys copying one wide mapping into many: 450 KB that would expand to 50 million pairs."""
    lines = [V2 + "actions: {audit.note: {decision: allow}}"]
    lines.append("base: &b {" + ", ".join(f"k{i}: 1" for i in range(keys)) + "}")
    lines.append("copies:")
    lines.extend(f"  - {{<<: [{', '.join(['*b'] * 9)}]}}" for _ in range(mappings))
    return "\n".join(lines) + "\n"


#: name -> (the file's bytes, fragments the message must hold after "<path>").
HOSTILE: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "alias bomb": (list_bomb().encode(), (", line 14: ", "expands to more than", "alias")),
    "wide merge-key bomb": (wide_merge_bomb().encode(), (", line ", "expands to more than", "merge keys")),
    "nested merge keys": (nested_merge_bomb().encode(), (", line 3: top level: unknown key(s) 'm0'",)),
    "deep nesting": ((V2 + "actions: {}\nx: " + "[" * 200_000 + "\n").encode(), ("nest",)),
    "oversized": ((REFUND + "#" * (2 << 20) + "\n").encode(), (": the policy file is ", "bytes, more than the")),
    "NUL byte": (REFUND.encode() + b"note: a\x00b\n", (", line 10: ", "U+0000 (NUL)", "column 8")),
    "escaped lone surrogate": (
        REFUND.replace('"refund:{payment_id}"', '"refund:\\ud800{payment_id}"').encode(),
        ("line 4", "escape"),
    ),
    "sexagesimal int": (
        REFUND.replace("amount_lte: 50000", "amount_lte: 1:30").encode(),
        (", line 6: ", "1:30 is a sexagesimal", "as 90", "quote"),
    ),
    "bidi action name": (
        REFUND.replace("stripe.refund:", '"stripe.refund\\u202e":').encode(),
        (", line 3: actions: ", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ),
}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _environment(**extra: str) -> dict[str, str]:
    """This environment without any store or settings of the test run, plus ``extra``."""
    env = {
        key: value for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE",
                       "CTRLRUN_CONFIG", "CTRLRUN_POLICY")
    }
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True,
        timeout=PROCESS_TIMEOUT_SECONDS, preexec_fn=_limit_memory,
    )


def _assert_message(message: str, path: Path, fragments: tuple[str, ...]) -> None:
    assert message.startswith(str(path)), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.fixture(scope="module")
def state_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One standalone SQLite store for every script here (migrated by the first)."""
    return tmp_path_factory.mktemp("hostile-store") / "state.db"


@pytest.mark.parametrize("case", list(HOSTILE))
def test_check_reports_the_policy_error(case: str, tmp_path: Path) -> None:
    """`manage.py check` reports the hostile policy as one ctrlrun.E002 line, with no traceback."""
    content, fragments = HOSTILE[case]
    path = tmp_path / "ctrlrun.yaml"
    path.write_bytes(content)
    env = _environment(DJANGO_SETTINGS_MODULE="project.settings", CTRLRUN_POLICY=str(path),
                       DATABASE_URL=f"sqlite:///{tmp_path / 'check.db'}")
    result = _run([sys.executable, str(REPO / "manage.py"), "check"], REPO, env)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    reported = [line for line in result.stderr.splitlines() if "(ctrlrun.E002)" in line]
    assert len(reported) == 1, result.stderr[-3000:]
    _assert_message(reported[0].split("(ctrlrun.E002) ", 1)[1], path, fragments)
    assert "HINT: fix the policy file" in result.stderr


FIRST_CALL = """\
import sys
import time

import ctrlrun

ctrlrun.setup()  # Django and the store first: only what the policy costs is timed below


@ctrlrun.protect("audit.note")
def note() -> str:
    return "ran"


started = time.monotonic()
try:
    with ctrlrun.context(agent="hostile-policy-test"):
        note()
except ctrlrun.PolicyError as exc:
    print(f"PolicyError: {exc}")
else:
    print("the protected call ran")
print(f"refused in {time.monotonic() - started:.3f}s")
"""


@pytest.mark.parametrize("case", list(HOSTILE))
def test_first_protected_call_raises_one_policy_error(case: str, tmp_path: Path, state_db: Path) -> None:
    """A script's first protected call raises the same one-line PolicyError, quickly, with no traceback."""
    content, fragments = HOSTILE[case]
    path = tmp_path / "ctrlrun.yaml"
    path.write_bytes(content)
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(FIRST_CALL))
    env = _environment(CTRLRUN_CONFIG=str(path), CTRLRUN_STATE=str(state_db))
    result = _run([sys.executable, str(script)], tmp_path, env)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    assert lines[0].startswith("PolicyError: "), lines[0]
    _assert_message(lines[0].removeprefix("PolicyError: "), path, fragments)
    seconds = float(lines[1].removeprefix("refused in ").removesuffix("s"))
    assert seconds < REFUSAL_SECONDS, lines[1]


def test_a_modest_policy_still_runs(tmp_path: Path, state_db: Path) -> None:
    """The same script under an ordinary policy (anchors and a merge key included) runs the call."""
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(V2 + "actions:\n  base: &allowed {decision: allow}\n  audit.note: {<<: *allowed}\n")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(FIRST_CALL))
    result = _run([sys.executable, str(script)], tmp_path, _environment(CTRLRUN_CONFIG=str(path),
                                                                         CTRLRUN_STATE=str(state_db)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[0] == "the protected call ran", result.stdout
