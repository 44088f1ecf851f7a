"""The store's two surfaces, read from the code (``ctrlrun/store/__init__.py`` says what they are).

Inside the package its modules share the names without an underscore; an underscore name never
leaves its module. Outside, ctrlrun (migrations included) and the benches reach the store through
``ctrlrun.store`` or a module's public names, never an underscore name of the store's."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
STORE = REPO / "ctrlrun" / "store"
SIBLINGS = {path.stem for path in STORE.glob("*.py")} - {"__init__"}


def _reaches(path: Path, inside: bool) -> list[str]:
    """``file:line name`` for each underscore name of the store that ``path`` imports or reads."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            of_store = (node.level == 1 and (inside or path.parent == STORE)) or module.startswith("ctrlrun.store")
            if of_store:
                found += [f"{path.name}:{node.lineno} {alias.name}" for alias in node.names
                          if alias.name.startswith("_") and alias.name != "__all__"]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name in SIBLINGS | {"store"} and not (inside and name == "store"):
                found.append(f"{path.name}:{node.lineno} {name}.{node.attr}")
    return found


def test_no_store_module_imports_a_siblings_underscore_name():
    reaches = [hit for path in sorted(STORE.glob("*.py")) for hit in _reaches(path, inside=True)]
    assert reaches == [], "an underscore name left its module inside the store:\n" + "\n".join(reaches)


def test_nothing_outside_the_store_reaches_an_underscore_name_of_it():
    outside = [path for path in sorted((REPO / "ctrlrun").rglob("*.py")) if STORE not in path.parents]
    outside += sorted((REPO / "bench").rglob("*.py"))
    reaches = [hit for path in outside for hit in _reaches(path, inside=False)]
    assert reaches == [], "code outside the store reached an underscore name of it:\n" + "\n".join(reaches)


def test_the_check_sees_a_reach_through(tmp_path):
    """The reader is not blind: both forms of reach-through are found."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ctrlrun.store.base import _private\nfrom ctrlrun import store\nstore.effects._move\n")
    assert _reaches(probe, inside=False) == ["probe.py:1 _private", "probe.py:3 effects._move"]


def _public_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    names |= {target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
              if isinstance(target, ast.Name)}
    names |= {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)
              and isinstance(node.target, ast.Name)}
    return {name for name in names if not name.startswith("_")}


def test_the_two_dialects_answer_the_same_questions():
    """``store.sqlite`` and ``store.postgresql`` define one set of names, and only they test the vendor."""
    assert _public_names(STORE / "sqlite.py") == _public_names(STORE / "postgresql.py")
    testers = [f"{path.name}:{node.lineno}" for path in sorted(STORE.glob("*.py"))
               if path.name not in ("base.py", "sqlite.py", "postgresql.py")
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)
               and node.attr in ("vendor", "has_select_for_update")]
    assert testers == [], "the vendor is tested outside the dialect modules: " + ", ".join(testers)
