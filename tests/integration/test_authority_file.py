"""A standalone authority file (§C2): the grants kept apart from the rules, enforced with them, hashed
as an inline section's would be; from Python, from settings and through manage.py check."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun.control import Control
from ctrlrun.errors import PolicyError
from ctrlrun.models import PolicyDocument
from ctrlrun.policy import load_authority, load_policy, parse_authority, parse_policy
from tests.support import receipts

pytestmark = pytest.mark.usefixtures("store_db")

RULES = """\
schema: ctrlrun.policy/v7
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
SECTION = """\
authority:
  grants:
    - id: support
      subject: {agent: "support-*"}
      actions: [stripe.refund]
      constraints: {amount_lte: 50000}
      budgets: [{metric: amount, limit: 100000, window: P1D}]
"""
STANDALONE = "schema: ctrlrun.policy/v7\n" + SECTION


@pytest.fixture
def files(tmp_path):
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "grants.yaml").write_text(STANDALONE)
    return tmp_path / "rules.yaml", tmp_path / "grants.yaml"


def test_standalone_grants_are_enforced_and_hash_as_inline_ones(files):
    rules, grants = files
    apart = load_policy(rules, authority=grants)
    inline = parse_policy(RULES + SECTION)
    assert apart.hash == inline.hash and list(apart.authority.grants) == ["support"]
    assert load_policy(rules).hash != apart.hash  # without the grants it is another policy
    control = Control(rules, authority=grants)
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 100}, lambda: "ok",
                        principal="support-bot") == "ok"
    with pytest.raises(ctrlrun.AuthorityDenied):
        control.call("stripe.refund", {"payment_id": "p2", "amount": 100}, lambda: "ok", principal="mallory")
    assert receipts()[0]["authority_grant_id"] == "support"
    # Both texts are kept in the store: the policy row names the grants' file and identity.
    stored = PolicyDocument.objects.get(pk=apart.hash)
    assert str(grants) in stored.source and stored.text == RULES
    grants_row = PolicyDocument.objects.get(pk=load_authority(grants).hash)
    assert grants_row.text == STANDALONE


def test_from_settings(files, settings):
    from ctrlrun.protect import reset_runtime

    rules, grants = files
    settings.CTRLRUN_POLICY, settings.CTRLRUN_AUTHORITY = str(rules), str(grants)
    reset_runtime()

    @ctrlrun.protect("stripe.refund")
    def refund(payment_id: str, amount: int) -> str:
        return "ok"

    with ctrlrun.context(agent="mallory"), pytest.raises(ctrlrun.AuthorityDenied):
        refund(payment_id="p1", amount=1)
    with ctrlrun.context(agent="support-bot"):
        assert refund(payment_id="p2", amount=1) == "ok"


def test_both_files_declaring_grants_is_refused(files, tmp_path):
    rules, grants = files
    (tmp_path / "both.yaml").write_text(RULES + SECTION)
    with pytest.raises(PolicyError, match="declares one too"):
        load_policy(tmp_path / "both.yaml", authority=grants)


@pytest.mark.parametrize(("text", "fragment"), [
    (STANDALONE + "actions: {}\n", "'actions' belongs in the policy file"),
    (STANDALONE + "mode: observe\n", "'mode' belongs in the policy file"),
    (STANDALONE + "environment: staging\n", "'environment' belongs in the policy file"),
    ("schema: ctrlrun.policy/v7\n", "needs an 'authority' section"),
    ("schema: ctrlrun.policy/v2\n" + SECTION, "ctrlrun.policy/v3"),
    (STANDALONE + "  break_glass: {}\n", "'break_glass' cannot be in a standalone"),
    (STANDALONE + "colour: red\n", "unknown key(s) 'colour'"),
    ("- a list\n", "a mapping"),
])
def test_what_a_standalone_document_refuses(text, fragment):
    with pytest.raises(PolicyError) as caught:
        parse_authority(text, "grants.yaml")
    assert fragment in str(caught.value) and str(caught.value).startswith("grants.yaml")


def test_a_missing_authority_file_is_one_clear_error(files, tmp_path):
    rules, _ = files
    with pytest.raises(PolicyError, match="authority file .*could not be read"):
        load_policy(rules, authority=tmp_path / "nope.yaml")
    with pytest.raises(ctrlrun.InvalidArgument, match="authority"):
        Control(rules, authority=42)


def test_manage_py_check_reports_the_authority_file(files, settings):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    rules, grants = files
    grants.write_text(STANDALONE.replace("P1D", "P1M"))
    settings.CTRLRUN_POLICY, settings.CTRLRUN_AUTHORITY = str(rules), str(grants)
    with pytest.raises(SystemCheckError) as caught:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert str(grants) in str(caught.value) and "no months" in str(caught.value)


def test_control_from_file_reads_the_settings_authority_file_too(files, settings):
    # Control.from_file() without a path is the settings' policy: it must come with the settings'
    # grants, as the default Control's does. Without them no grant is checked (fail-open).
    rules, grants = files
    settings.CTRLRUN_POLICY, settings.CTRLRUN_AUTHORITY = str(rules), str(grants)
    control = Control.from_file()
    assert control.policy.hash == load_policy(rules, authority=grants).hash
    with pytest.raises(ctrlrun.AuthorityDenied):
        control.call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="mallory")


def test_a_policy_with_standalone_grants_keeps_them_under_another_environment(files):
    # Control(policy, environment=...) parses the policy's text again for the environment: the
    # grants of its authority file must come along, or no grant is checked (fail-open).
    rules, grants = files
    control = Control(load_policy(rules, authority=grants), environment="staging")
    assert control.policy.environment == "staging"
    assert control.policy.hash == load_policy(rules, environment="staging", authority=grants).hash
    with pytest.raises(ctrlrun.AuthorityDenied):
        control.call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="mallory")


def test_an_explicit_policy_path_takes_the_deployments_authority_file_too(files, settings):
    """CTRLRUN_AUTHORITY names grants for this process: a Control given a policy path enforces them as well
    (never silently without them)."""
    rules, grants = files
    settings.CTRLRUN_AUTHORITY = str(grants)
    control = Control(rules)
    assert control.read_policy().authority is not None
    with pytest.raises(ctrlrun.AuthorityDenied):
        control.call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="mallory")
