"""Delegation's pure layer (reference-capabilities §C3): containment (every dimension, every
refusal), creation refusals in their order, and evaluation over chains re-walked every time."""
from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from ctrlrun.policy.authority import DIMENSIONS, Delegation, containment, contains
from ctrlrun.canonical import Action, Principal
from ctrlrun.policy import grant_from_json, grant_json, parse_grant, parse_policy

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  max_delegation_depth: 2
  grants:
    - id: support
      subject: {agent: "support-*", user: "alice"}
      actions: ["stripe.**"]
      resources: ["payment:*"]
      constraints: {amount_lte: 50000, currency_in: [usd, eur], mode_eq: live}
      environments: [production, staging]
      expires_at: "2026-12-31T00:00:00Z"
      delegable: true
      tasks: ["run-*"]
      budgets: [{metric: amount, limit: 100000, window: P1D}]
    - id: plain
      subject: {agent: mailer}
      actions: [email.send]
    - id: open
      subject: {agent: boss}
      actions: ["stripe.*"]
      expires_at: "2026-12-31T00:00:00Z"
      delegable: true
actions:
  stripe.refund: {decision: allow}
  email.send: {decision: allow}
"""
AUTHORITY = parse_policy(POLICY).authority
CHILD = """\
subject: {agent: support-bot, user: alice}
actions: [stripe.refund]
resources: ["payment:txn_*"]
constraints: {amount_lte: 100, currency_in: [usd], mode_eq: live}
environments: [production]
expires_at: "2026-12-10T00:00:00Z"
tasks: ["run-7"]
budgets: [{metric: amount, limit: 500, window: P2D}]
"""


def child(**changes: object) -> object:
    return dataclasses.replace(parse_grant(CHILD), **changes)


@pytest.mark.parametrize(("parent", "pattern", "expected"), [
    ("stripe.**", "stripe.refund", True),
    ("stripe.**", "stripe.refund.partial", True),
    ("stripe.**", "stripe.**", True),
    ("stripe.**", "stripe.refund.**", True),
    ("stripe.**", "stripe", False),             # containment is not matching: Q.** does not contain Q
    ("stripe.**", "stripe.*", True),
    ("stripe.*", "stripe.refund", True),
    ("stripe.*", "stripe.ref*", True),
    ("stripe.*", "stripe.**", False),
    ("stripe.ref*", "stripe.*", False),
    ("stripe.ref*", "stripe.refund*", True),
    ("stripe.refund", "stripe.refund", True),
    ("stripe.refund", "stripe.refund*", False),
    ("stripe.refund", "stripe.refund.x", False),
    ("a.b.**", "a.**", False),
])
def test_contains(parent: str, pattern: str, expected: bool) -> None:
    assert contains(parent, pattern, ".") is expected


def test_contains_subjects_and_colons() -> None:
    assert contains("support-*", "support-bot", "", subject=True)
    assert not contains("support-bot", "support-*", "", subject=True)
    assert contains("payment:**", "payment:txn_1:x", ":")
    assert not contains("payment:*", "payment:txn_1:x", ":")


def test_a_narrower_child_is_contained() -> None:
    assert containment(AUTHORITY.grants["support"], child()) is None
    # handed to another principal: the agent may differ; the user stays bound
    assert containment(AUTHORITY.grants["support"], child(agent="billing-bot")) is None


@pytest.mark.parametrize(("changes", "dimension"), [
    ({"agent": "support-*"}, "subject"),                 # the child agent is literal
    ({"agent": None}, "subject"),
    ({"user": "bob"}, "subject"),
    ({"user": None}, "subject"),                         # the parent's user binds the child's
    ({"actions": ("stripe",)}, "actions"),
    ({"actions": ("email.send",)}, "actions"),
    ({"resources": None}, "resources"),                  # a parent key the child omits fails
    ({"resources": ("payment:**",)}, "resources"),
    ({"resources": ("invoice:*",)}, "resources"),
    ({"constraints": None}, "constraints"),
    ("amount_lte: 60000", "constraints"),
    ("currency_in: [usd, gbp]", "constraints"),
    ("mode_eq: test", "constraints"),
    ("drop currency_in", "constraints"),
    ({"environments": None}, "environments"),
    ({"environments": ("production", "dev")}, "environments"),
    ({"expires_at": None}, "expires_at"),
    ({"expires_at": dt.datetime(2027, 1, 1, tzinfo=dt.timezone.utc)}, "expires_at"),
    ({"tasks": None}, "tasks"),
    ({"tasks": ("job-1",)}, "tasks"),
    ({"budgets": None}, "budgets"),
    ("budget limit 200000", "budgets"),
    ("budget window PT1H", "budgets"),
    ("budget metric count", "budgets"),
])
def test_each_dimension_refuses(changes: object, dimension: str) -> None:
    if isinstance(changes, dict):
        grant = child(**changes)
    else:
        text = CHILD
        text = {
            "amount_lte: 60000": text.replace("amount_lte: 100", "amount_lte: 60000"),
            "currency_in: [usd, gbp]": text.replace("currency_in: [usd]", "currency_in: [usd, gbp]"),
            "mode_eq: test": text.replace("mode_eq: live", "mode_eq: test"),
            "drop currency_in": text.replace("currency_in: [usd], ", ""),
            "budget limit 200000": text.replace("limit: 500", "limit: 200000"),
            "budget window PT1H": text.replace("P2D", "PT1H"),
            "budget metric count": text.replace("metric: amount", "metric: count"),
        }[changes]
        grant = parse_grant(text)
    assert containment(AUTHORITY.grants["support"], grant) == dimension


def test_dimensions_are_checked_in_the_specs_order() -> None:
    assert DIMENSIONS == ("subject", "actions", "resources", "constraints", "environments", "expires_at", "tasks",
                          "budgets")
    grant = child(actions=("email.send",), resources=None, tasks=None)
    assert containment(AUTHORITY.grants["support"], grant) == "actions"


def test_lower_and_greater_bounds() -> None:
    parent = parse_grant("subject: {agent: a}\nactions: [x]\nconstraints: {n_gte: 5, m_gt: 1}\n")
    assert containment(parent, parse_grant("subject: {agent: a}\nactions: [x]\nconstraints: {n_gte: 6, m_gt: 1}\n")) is None
    assert containment(parent, parse_grant("subject: {agent: a}\nactions: [x]\nconstraints: {n_gte: 4, m_gt: 1}\n")) \
        == "constraints"


def test_grant_json_round_trips() -> None:
    grant = child()
    text = grant_json(grant)
    assert '"id"' not in text and '"window":172800' in text and "+00:00" in text
    assert grant_from_json(text, "dlg_" + "0" * 32) == dataclasses.replace(grant, id="dlg_" + "0" * 32)
    for bad in ("{", "[]", '{"subject": {"agent": "a"}}', '{"subject": {"agent": "a"}, "actions": ["x"], "x": 1}'):
        with pytest.raises(ValueError):
            grant_from_json(bad, "dlg_x")


# --------------------------------------------------------------------------- creation refusals

def refusal(parent: str, grant: object, agent: str = "support-bot", user: str | None = "alice",
            delegations: tuple = ()) -> object:
    return AUTHORITY.delegation_refusal(parent, grant, agent, user, now=NOW, delegations=delegations)


def dlg(ident: str, parent: str, depth: int, grant: object, *, revoked: bool = False, **extra: object) -> Delegation:
    return Delegation(ident, parent, depth, dataclasses.replace(grant, id=ident), "support-bot", "alice", "api",
                      NOW, NOW if revoked else None, "ops" if revoked else None, **extra)


def delegable_child(**changes: object) -> object:
    return child(delegable=True, **changes)


def test_creation_refusals_in_order() -> None:
    assert refusal("support", child()) == 1
    assert refusal("nope", child())[0] == "unknown_parent"
    assert refusal("plain", child(), agent="mailer", user=None)[0] == "parent_not_delegable"
    late = AUTHORITY.delegation_refusal("support", child(), "support-bot", "alice",
                                        now=dt.datetime(2027, 1, 2, tzinfo=dt.timezone.utc))
    assert late[0] == "parent_not_valid"
    assert refusal("support", child(), agent="mallory")[0] == "not_the_subject"
    assert refusal("support", child(), user="bob")[0] == "not_the_subject"
    assert refusal("support", child(resources=None)) == ("containment", "resources",
                                                          "the grant is not contained in 'support' on 'resources'")
    one = dlg("dlg_1", "support", 1, delegable_child())
    two = dlg("dlg_2", "dlg_1", 2, delegable_child())
    assert refusal("dlg_1", child(), delegations=(one,)) == 2
    assert refusal("dlg_2", child(), delegations=(one, two))[0] == "max_depth"
    assert refusal("dlg_1", child(), delegations=(dlg("dlg_1", "support", 1, child()),))[0] == "parent_not_delegable"
    revoked = dlg("dlg_1", "support", 1, delegable_child(), revoked=True)
    assert refusal("dlg_1", child(), delegations=(revoked,))[0] == "parent_not_valid"
    unreadable = Delegation("dlg_9", "support", 1, None, "x", None, "api", NOW, problem="bad JSON")
    assert refusal("support", child(), delegations=(unreadable,))[0] == "parent_not_valid"


# --------------------------------------------------------------------------- evaluation over chains

def action(agent: str = "support-bot", user: str | None = "alice", name: str = "stripe.refund", **arguments: object):
    return Action(name, {"amount": 50, "currency": "usd", "mode": "live", **arguments}, Principal(agent, user),
                  resource="payment:txn_1", environment="production")


def test_a_delegation_passes_and_names_its_chain() -> None:
    one = dlg("dlg_1", "support", 1, child())
    result = AUTHORITY.evaluate(action(), now=NOW, task="run-7", delegations=(one,))
    assert result.passed and result.delegation_id == "dlg_1" and result.grant_id == "dlg_1" and result.depth == 1
    assert [g.id for g in result.chain] == ["dlg_1", "support"]
    assert result.event_data() == {"reason": "authority_grant", "grant_id": "dlg_1", "delegation_id": "dlg_1",
                                   "depth": 1}
    charges = AUTHORITY.charges(result, {"amount": 50})
    assert [(ident, budget.limit, cost) for ident, budget, cost in charges] == [("dlg_1", 500, 50),
                                                                                ("support", 100000, 50)]


def test_the_smallest_passing_id_wins() -> None:
    # the root passes too; 'dlg_1' < 'support' by code point
    one = dlg("dlg_1", "support", 1, child())
    assert AUTHORITY.evaluate(action(), now=NOW, task="run-7", delegations=(one,)).grant_id == "dlg_1"


def test_a_revoke_above_refuses_every_delegation_beneath() -> None:
    one = dlg("dlg_1", "support", 1, delegable_child(), revoked=True)
    two = dlg("dlg_2", "dlg_1", 2, child())
    result = AUTHORITY.evaluate(action(user=None, agent="support-bot"), now=NOW, task="run-7",
                                delegations=(one, two))
    assert not result.passed  # (the root needs user alice: it does not cover this call)
    result = AUTHORITY.evaluate(action(), now=NOW, task="run-7", delegations=(one, two))
    assert result.passed and result.grant_id == "support"  # the root itself still passes
    narrower = dataclasses.replace(AUTHORITY, grants={"support": AUTHORITY.grants["support"]})
    result = narrower.evaluate(action(amount=60000), now=NOW, task="run-7", delegations=(one, two))
    assert result.reason == "authority_revoked" and result.delegation_id in ("dlg_1", "dlg_2")
    assert result.event_data()["revoked_id"] == "dlg_1"


def test_an_expired_parent_or_a_narrowed_root_refuses() -> None:
    only_child = dataclasses.replace(AUTHORITY, grants={"support": AUTHORITY.grants["support"]})
    one = dlg("dlg_1", "support", 1, child(constraints=None))  # escalates: the root has constraints
    result = only_child.evaluate(action(), now=NOW, task="run-7", delegations=(one,))
    # the root passes; the delegation alone escalates
    assert result.passed and result.grant_id == "support"
    bigger = action(amount=60000)
    result = only_child.evaluate(bigger, now=NOW, task="run-7", delegations=(one,))
    assert result.reason == "authority_escalation" and result.details["dimension"] == "constraints"
    late = dt.datetime(2027, 1, 2, tzinfo=dt.timezone.utc)
    ok = dlg("dlg_1", "support", 1, child(expires_at=None))
    result = AUTHORITY.evaluate(action(), now=late, task="run-7", delegations=(ok,))
    assert result.reason == "authority_escalation"  # expires_at omitted under an expiring parent
    fine = dlg("dlg_1", "support", 1, child(expires_at=dt.datetime(2026, 12, 31, tzinfo=dt.timezone.utc)))
    result = AUTHORITY.evaluate(action(), now=dt.datetime(2026, 12, 30, 23, tzinfo=dt.timezone.utc),
                                task="run-7", delegations=(fine,))
    assert result.passed


def test_a_missing_parent_a_cycle_and_the_depth_escalate() -> None:
    orphan = dlg("dlg_1", "gone", 1, child())
    result = AUTHORITY.evaluate(action(amount=60000), now=NOW, task="run-7", delegations=(orphan,))
    assert result.reason == "authority_escalation" and result.details == {"missing_parent_id": "gone"}
    a = dlg("dlg_a", "dlg_b", 1, delegable_child())
    b = dlg("dlg_b", "dlg_a", 1, delegable_child())
    result = AUTHORITY.evaluate(action(amount=60000), now=NOW, task="run-7", delegations=(a, b))
    assert result.reason == "authority_escalation" and "cycle_at" in result.details
    shallow = dataclasses.replace(AUTHORITY, max_delegation_depth=1)
    one = dlg("dlg_1", "support", 1, delegable_child())
    two = dlg("dlg_2", "dlg_1", 2, child())
    only = dataclasses.replace(shallow, grants={"support": AUTHORITY.grants["support"]})
    result = only.evaluate(action(amount=60000), now=NOW, task="run-7", delegations=(one, two))
    assert result.reason == "authority_escalation"
    result = only.evaluate(action(user="alice"), now=NOW, task="run-7", delegations=(two, one))
    assert result.passed and result.grant_id == "dlg_1"  # dlg_2 (too deep) does not pass; dlg_1 does


def test_an_unreadable_row_refuses_every_action() -> None:
    unreadable = Delegation("dlg_9", "support", 1, None, "x", None, "api", NOW, problem="created_via 'fax'")
    result = AUTHORITY.evaluate(action(agent="mailer", user=None, name="email.send"), now=NOW,
                                delegations=(unreadable,))
    assert result.reason == "authority_unreadable" and result.delegation_id == "dlg_9"
    assert AUTHORITY.delegates
    assert not dataclasses.replace(AUTHORITY, max_delegation_depth=0).delegates
