"""Every install line in the docs and the code installs this project, never the package called
``ctrlrun`` on PyPI (the reference implementation, another code base).

This project's distribution is ``django-ctrlrun`` (it imports as ``ctrlrun``; its command is
``ctrlrun``), not yet published: the docs install it from a clone (``pip install -e '.[extra]'``),
and a missing optional dependency names the dependency itself (``pip install 'httpx>=0.27'``),
which works however ctrlrun was installed. The one line allowed to name ``ctrlrun`` is the
benchmark's install of the reference, pinned (``ctrlrun==0.12.2``), under ``bench/``.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib

import pytest

from tests.support import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: The reference, installed on purpose beside this project by bench/compare.py.
REFERENCE_PIN = "ctrlrun==0.12.2"

INSTALL = re.compile(r"\b(?:pip3?|uv\s+pip)\s+install\b|\buv\s+add\b|\bpoetry\s+add\b")
#: Where a command ends inside a line of text.
END = re.compile(r"`|&&|\|\||;|\n\s*\n|\)\s|\)$")


def commands(text: str) -> list[str]:
    """The install commands in a text: from ``pip install`` to the end of the command (a closing
    backtick, ``&&``, ``;``, a closing parenthesis or a blank line), lines joined."""
    found = []
    for match in INSTALL.finditer(text):
        rest = text[match.end():match.end() + 300]
        end = END.search(rest)
        found.append(" ".join((match.group(0) + rest[:end.start() if end else len(rest)]).split()))
    return found


def named_distributions(command: str) -> list[str]:
    """The requirements a command names (``'ctrlrun[httpx]'``, ``django-ctrlrun``), paths and options left out."""
    out = []
    for word in command.split()[2:]:
        word = word.strip("'\"")
        if not word or word.startswith(("-", ".", "/", "(", "~", "$")) or "/" in word:
            continue
        if re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?([<>=!~]=?[^\s]*)?$", word):
            out.append(word)
    return out


def names_bare_ctrlrun(requirement: str) -> bool:
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower() == "ctrlrun"


def texts() -> list[tuple[str, str]]:
    """(file, text) for every page and source file a user reads an install line in: the Markdown
    pages, .ci/run, and every string literal (messages, docstrings) of the Python code."""
    out: list[tuple[str, str]] = []
    for path in sorted([*REPO.glob("*.md"), *REPO.glob("docs/*.md"), *REPO.glob("bench/*.md"), REPO / ".ci" / "run",
                        *REPO.glob("requirements*.txt")]):
        out.append((path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")))
    for folder in ("ctrlrun", "bench", "project"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                       and isinstance(node.value, str)]
            out.append((path.relative_to(REPO).as_posix(), "\n\n".join(strings)))
    return out


def offending(name: str, text: str) -> list[str]:
    bad = []
    for command in commands(text):
        for requirement in named_distributions(command):
            if names_bare_ctrlrun(requirement) and not (requirement == REFERENCE_PIN and name.startswith("bench/")):
                bad.append(command)
    return bad


def test_the_scanner_finds_the_install_lines_it_must_refuse():
    """What the check below reads as installing the bare `ctrlrun` distribution, and what it lets through."""
    refused = ["`pip install 'ctrlrun[pydantic-ai]'` (it installs pydantic-ai-slim)",
               "pip install ctrlrun", 'needs httpx: pip install "ctrlrun[httpx]"', "`pip install -U ctrlrun>=0.1`",
               "`pip install -q -e . &&` and `uv add\nctrlrun`", "`pip install ctrlrun==0.12.2` (the reference)"]
    allowed = ["`pip install -e '.[pydantic-ai]'` in a clone",
               "pip install 'httpx>=0.27' (django-ctrlrun's httpx extra)",
               "`pip install 'django-ctrlrun[langchain]'`", "`pip install -e\n'/path/to/the/clone[pydantic-ai]'` into",
               "`.venv/bin/pip install -q -e \".[test]\" && .venv/bin/python -m pytest` then ctrlrun receipts",
               "pip install ctrlrun-tools"]
    assert [text for text in refused if not offending("docs/x.md", text)] == []
    assert [text for text in allowed if offending("docs/x.md", text)] == []
    assert offending("bench/README.md", "`/tmp/ref/bin/pip install ctrlrun==0.12.2 'psycopg[binary]'`") == []


def test_no_install_line_in_the_docs_or_the_code_names_the_bare_ctrlrun_distribution():
    """README, docs/, bench/, .ci/run and every string of the code: `pip install` never names `ctrlrun`
    (another project's package on PyPI), except the benchmark's pinned install of the reference."""
    scanned = texts()
    assert len([name for name, text in scanned if commands(text)]) >= 8  # the scan reads the lines it should
    bad = {name: found for name, text in scanned if (found := offending(name, text))}
    assert bad == {}


def test_the_distribution_is_django_ctrlrun_importing_as_ctrlrun_with_the_ctrlrun_command():
    project = PYPROJECT["project"]
    assert project["name"] == "django-ctrlrun"
    assert project["scripts"] == {"ctrlrun": "ctrlrun.cli:main"}
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["ctrlrun*"]


@pytest.mark.parametrize("module,hidden,extra", [
    ("ctrlrun.adapters.pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("ctrlrun.adapters.langchain", "langchain", "langchain"),
    ("ctrlrun.adapters.openai_agents", "agents", "openai-agents"),
    ("ctrlrun._transport_httpx", "httpx", "httpx"),
])
def test_a_missing_optional_dependency_names_what_to_install_as_the_extra_requires_it(module, hidden, extra):
    """Without the framework (or httpx), importing the module says `pip install '<the extra's requirement>'`,
    the same floor as pyproject.toml's extra, which works however ctrlrun itself was installed."""
    (requirement,) = PYPROJECT["project"]["optional-dependencies"][extra]
    script = (f"import sys; sys.modules[{hidden!r}] = None\n"
              f"try:\n    import {module}\nexcept ImportError as exc:\n    print(exc)\nelse:\n    print('imported')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert f"pip install '{requirement}'" in line and f"django-ctrlrun's {extra} extra" in line, line
    assert "\n" not in line and offending(module, line) == []
