"""No test module imports another: what several share is a helper in ``tests/support/``, a fixture in
a ``conftest.py`` (pytest gives it to every module below, unimported) or a policy in
``tests/policies/*.yaml``. A test module is any ``test_*.py`` or ``conftest.py`` under ``tests/``;
every import is read, those inside functions too."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent


def is_test_module(path: Path) -> bool:
    return path.suffix == ".py" and (path.name.startswith("test_") or path.name == "conftest.py")


def module_path(name: str) -> Path | None:
    """The file of a module of this repository named ``name`` (a package's ``__init__.py``), if any."""
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_files(source: str, package: str) -> set[Path]:
    """Every file of this repository that ``source`` (a module of ``package``) imports; ``from a import b``
    counts ``a.b`` too when it is a module."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {file for file in map(module_path, names) if file is not None}
    return found


def imports_of(path: Path) -> set[Path]:
    return imported_files(path.read_text(), ".".join(path.relative_to(REPO).parts[:-1]))


def test_the_import_reader_sees_every_kind_of_import():
    source = ("import tests.unit.test_canonical\n"
              "from tests.unit import test_states\n"
              "def later():\n    from .test_policy import parse_policy\n"
              "from ..e2e.conftest import chromium\n"
              "from tests.support import receipts\n"
              "import json, ctrlrun.errors\n")
    found = {file.relative_to(REPO).as_posix() for file in imported_files(source, "tests.unit")}
    assert found == {"tests/unit/test_canonical.py", "tests/unit/test_states.py", "tests/unit/test_policy.py",
                     "tests/e2e/conftest.py", "tests/support/__init__.py", "tests/unit/__init__.py", "ctrlrun/errors.py"}


def test_no_test_module_imports_another():
    modules = sorted(path for path in TESTS.rglob("*.py") if is_test_module(path))
    assert len(modules) > 50  # the walk found the suite
    offending = [f"{path.relative_to(REPO)} imports {file.relative_to(REPO)}"
                 for path in modules for file in sorted(imports_of(path)) if is_test_module(file)]
    assert offending == [], ("move what is shared to tests/support/ (helpers), a conftest.py (fixtures) or "
                             "tests/policies/ (policy texts):\n" + "\n".join(offending))
