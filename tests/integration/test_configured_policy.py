"""The configured policy has one reader, ``Control.read_policy()``, and one cache: the console, the
commands, the checks and the calls of one process describe the same policy, and an edited file is
read again everywhere (a broken edit refuses calls and is named on the pages; nothing keeps deciding
by the old text)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ctrlrun
from ctrlrun import reconcile, store
from ctrlrun.admin import current_policy
from ctrlrun.admin.authority import _grants_policy
from ctrlrun.checks import check_policy
from ctrlrun.control import Control, default_control
from ctrlrun.kernel.runtime import Runtime
from tests.support import REFUND_POLICY, receipts

pytestmark = pytest.mark.usefixtures("store_db")

PACKAGE = Path(ctrlrun.__file__).resolve().parent
STRICTER = REFUND_POLICY.replace("amount_lte: 50000 }\n        decision: allow", "amount_lte: 50000 }\n        decision: deny")


@pytest.fixture
def configured(settings):
    """The settings' policy file, and calls that look at it on every call (not once a second)."""
    import ctrlrun.control

    path = Path(settings.CTRLRUN_POLICY)
    saved, ctrlrun.control._RECHECK_SECONDS = ctrlrun.control._RECHECK_SECONDS, 0.0
    yield path
    ctrlrun.control._RECHECK_SECONDS = saved


@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id: str, amount: int) -> str:
    return f"refunded {payment_id}"


def test_an_edited_policy_file_is_read_again_by_calls_pages_and_commands(configured, agent):
    """The same file, edited while the process runs: the next call decides by the new text (its
    receipt cites the new hash, stored before it decided), and the console's policy, the grants
    page and reconcile's action list are that same policy object."""
    assert refund("pay_1", 100) == "refunded pay_1"
    before = default_control().read_policy()
    assert current_policy() is before

    configured.write_text(STRICTER)
    after = default_control().read_policy()
    assert after.hash != before.hash
    assert current_policy() is after and _grants_policy() == (after, None)
    with pytest.raises(ctrlrun.ActionDenied):
        refund("pay_2", 100)
    assert receipts()[-1]["policy_hash"] == after.hash
    assert store.policy_document(after.hash) is not None
    assert "stripe.refund" in reconcile.known_actions()[0]


def test_a_broken_edit_refuses_calls_and_every_page_says_why(configured, agent):
    """A broken edit is never papered over by the text read before: calls refuse (PolicyError),
    the pages show no policy and give the loader's reason, ``manage.py check`` reports E002; fixing
    the file is enough to act again."""
    assert refund("pay_1", 100) == "refunded pay_1"
    configured.write_text(REFUND_POLICY.replace("actions:", "actions: [", 1))
    with pytest.raises(ctrlrun.PolicyError):
        refund("pay_2", 100)
    assert current_policy() is None
    policy, reason = _grants_policy()
    assert policy is None and str(configured.name) in reason
    assert [message.id for message in check_policy()] == ["ctrlrun.E002"]
    configured.write_text(REFUND_POLICY)
    assert refund("pay_2", 100) == "refunded pay_2"
    assert check_policy() == []


def test_a_control_given_its_policy_keeps_it(tmp_path, agent):
    """A Control given a file or a Policy reads it once: only the settings' policy follows its file."""
    path = tmp_path / "own.yaml"
    path.write_text(REFUND_POLICY)
    control = Control.from_file(path)
    first = control.read_policy()
    path.write_text(STRICTER)
    assert control.read_policy() is first


def test_the_kernel_reads_a_control_through_the_runtime_protocol():
    """``Control`` is a ``Runtime``, and no kernel module imports ``ctrlrun.control`` (the kernel
    knows the members it reads, named in ``kernel/runtime.py``, and nothing else)."""
    assert isinstance(default_control(), Runtime)
    for path in sorted((PACKAGE / "kernel").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").endswith("control"), f"{path.name} imports {node.module}"


def test_the_configured_policy_is_loaded_only_by_the_policy_package_and_the_control():
    """Every other module asks ``Control.read_policy()``: one cache, never five copies."""
    loaders = {"load_policy", "load_authority"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("policy", "migrations") or relative == Path("control.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            own_method = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "self"
            if name in loaders and not own_method:  # (a command's self.load_policy() asks the Control)
                found.append(f"{relative}:{node.lineno}")
    assert found == []
