"""The pure modules of ctrlrun import with Django blocked.

Which modules are pure is read from the code, not listed here: a module is pure when nothing in it
imports Django (its functions included, ``if TYPE_CHECKING:`` blocks aside), every ctrlrun module it
imports is pure, and the packages it sits in load without Django. A new module that imports no
Django is covered the day it is added; the modules docs/development.md calls pure must be found so."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGE = REPO / "ctrlrun"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


@cache
def imports(name: str, *, at_import_time: bool) -> frozenset[str]:
    """The modules ``name`` imports: everywhere in it, or only the statements run when it is imported
    (not those inside functions). ``from a import b`` is ``a.b`` when that is a ctrlrun module, else ``a``."""
    package = name if is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if at_import_time and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = {f"{base}.{alias.name}" for alias in node.names} & MODULES.keys()
            found.update(submodules or {base})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(MODULES[name].read_text(), str(MODULES[name])))
    return frozenset(found)


def is_django(name: str) -> bool:
    return name == "django" or name.startswith("django.")


def parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@cache
def reached(name: str, *, at_import_time: bool) -> frozenset[str] | None:
    """The ctrlrun modules ``name`` reaches through its imports (at import time: with the packages
    each loads first), or None when one of them imports Django."""
    found, todo = set(), [*parents(name), name] if at_import_time else [name]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        for imported in imports(current, at_import_time=at_import_time):
            if is_django(imported):
                return None
            if imported in MODULES:
                todo.extend([*parents(imported), imported] if at_import_time else [imported])
    return frozenset(found)


@cache
def is_pure(name: str) -> bool:
    used = reached(name, at_import_time=False)
    return used is not None and all(reached(module, at_import_time=True) is not None for module in used)


PURE = sorted(name for name in MODULES if is_pure(name))


def documented_pure() -> set[str]:
    """The modules (``x.py``) and packages (``x/``) on the lines of docs/development.md's layout (its first
    block) that say ``pure``."""
    text = (REPO / "docs" / "development.md").read_text()
    layout = text.split("## The layout", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    found = set()
    for line in layout.splitlines():
        if not re.match(r"  \S", line):  # only ctrlrun/'s own entries (indented once under it)
            continue
        names = re.findall(r"\b(\w+)(?:\.py\b|/)", line)  # a module, or a package: policy/
        if names and re.search(r"\bpure\b", line):
            found.update(f"ctrlrun.{name}" for name in names)
    return found


def test_the_reading_tells_pure_from_not():
    """Sanity of the reading itself: what docs/development.md calls pure is found pure; what reaches
    the store or the models, even from inside a function, is not; nor is a module whose package is not."""
    assert documented_pure() and documented_pure() <= set(PURE), sorted(documented_pure() - set(PURE))
    assert {"ctrlrun.models", "ctrlrun.store", "ctrlrun.admin", "ctrlrun.control", "ctrlrun.protect"}.isdisjoint(PURE)
    assert not is_pure("ctrlrun.store.sql")  # imports nothing, but its package loads the store
    assert {"ctrlrun.errors", "ctrlrun.kernel.steps"} <= set(PURE) and len(PURE) >= 15


def test_every_pure_module_imports_without_django():
    """Each pure module loads in a fresh interpreter where importing Django fails, and Django is never loaded."""
    script = textwrap.dedent(f"""
        import importlib, sys
        sys.modules["django"] = None  # any 'import django...' now raises ImportError
        for name in {PURE!r}:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                print(f"{{name}}: {{exc}}")
        loaded = [name for name in sys.modules if name.startswith("django") and sys.modules[name] is not None]
        print("django loaded:", loaded)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["django loaded: []"], done.stdout


def test_values_and_messages_work_without_django():
    """The store's value types and the messages are usable, not only importable, with Django blocked."""
    script = textwrap.dedent("""
        import sys
        sys.modules["django"] = None
        import ctrlrun.values as values, ctrlrun.messages as messages
        call = values.Call.__dataclass_fields__
        print(sorted(values.__all__)[0], "effect_key" in call, messages.command("reconcile"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["ApprovalView", "True"]
    assert "'ctrlrun reconcile' (or 'python manage.py reconcile')" in done.stdout
