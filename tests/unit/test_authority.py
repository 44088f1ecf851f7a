"""Authority's pure layer (reference-capabilities §C1, §C4, §C5): patterns, windows, costs, evaluation
and its precedence, the canonical form the policy hash covers."""
from __future__ import annotations

import datetime as dt
import textwrap

import pytest

from ctrlrun.policy.authority import Budget, budget_cost, matches, parse_window, validate_pattern, window_text
from ctrlrun.canonical import Action, Principal
from ctrlrun.errors import PolicyError
from ctrlrun.policy import parse_policy

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(("pattern", "value", "expected"), [
    ("stripe.refund", "stripe.refund", True),
    ("stripe.refund", "stripe.refunds", False),
    ("stripe.*", "stripe.refund", True),
    ("stripe.*", "stripe.refund.partial", False),   # '*' stays within its segment
    ("stripe.ref*", "stripe.refund", True),
    ("stripe.ref*", "stripe.charge", False),
    ("stripe.**", "stripe.refund", True),
    ("stripe.**", "stripe.refund.partial", True),
    ("stripe.**", "stripe", False),                  # '**' is one or more further segments
    ("Stripe.*", "stripe.refund", False),            # case matters
    ("*.refund", "stripe.refund", True),
])
def test_action_patterns(pattern: str, value: str, expected: bool) -> None:
    assert validate_pattern(pattern, ".") is None
    assert matches(pattern, value, ".") is expected


def test_resource_patterns_split_on_colons() -> None:
    assert matches("payment:*", "payment:txn_1", ":")
    assert not matches("payment:*", "payment:txn_1:extra", ":")
    assert matches("payment:**", "payment:txn_1:extra", ":")
    assert not matches("payment:*", None, ":")


@pytest.mark.parametrize("pattern", ["", "a.**.b", "**", "a.*.**", "a?", "a.[bc]", "a..b", "a.b*c", ".a"])
def test_bad_patterns(pattern: str) -> None:
    assert validate_pattern(pattern, ".") is not None


def test_subject_patterns() -> None:
    assert validate_pattern("support-*", "", subject=True) is None
    assert validate_pattern("sup*port", "", subject=True) is not None
    assert validate_pattern("support-**", "", subject=True) is not None
    assert matches("support-*", "support-bot", "", subject=True)
    assert matches("support.bot", "support.bot", "", subject=True)
    assert not matches("support-*", None, "", subject=True)


@pytest.mark.parametrize(("text", "seconds"), [
    ("P1D", 86400), ("PT1H", 3600), ("PT30M", 1800), ("PT45S", 45), ("P1DT12H", 129600), ("PT1H30M", 5400),
    ("P36525D", 36525 * 86400),
])
def test_windows(text: str, seconds: int) -> None:
    assert parse_window(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["P1M", "P1Y", "P1W", "PT0S", "P0D", "P", "PT", "P1DT", "PT1.5H", "1D", "p1d",
                                  "P36526D", 86400, None, "P99999999999D"])
def test_bad_windows(text: object) -> None:
    with pytest.raises(ValueError):
        parse_window(text)


def test_every_window_a_row_stores_reads_back():
    from ctrlrun.policy.authority import MAX_WINDOW, parse_window

    assert parse_window("P12000D") == parse_window(f"PT{12000 * 86400}S")
    assert parse_window(f"PT{int(MAX_WINDOW.total_seconds())}S") == MAX_WINDOW
    with pytest.raises(ValueError, match="hundred years"):
        parse_window(f"PT{int(MAX_WINDOW.total_seconds()) + 1}S")
    with pytest.raises(ValueError, match="hundred years"):
        parse_window("P99999999999D")


def test_window_text() -> None:
    assert window_text(86400) == "1 day"
    assert window_text(5400) == "1 hour 30 minutes"
    assert window_text(172801) == "2 days 1 second"


def test_costs() -> None:
    window = dt.timedelta(days=1)
    assert budget_cost(Budget("count", 5, window), {}) == 1
    assert budget_cost(Budget("amount", 5, window), {"amount": 40}) == 40
    assert budget_cost(Budget("amount", 5, window), {"amount": 0}) == 0
    for bad in ({}, {"amount": "5"}, {"amount": -1}, {"amount": True}, {"amount": None}, {"amount": [5]}):
        assert isinstance(budget_cost(Budget("amount", 5, window), bad), str)


GRANTS = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: support
      subject: {agent: "support-*"}
      actions: ["stripe.*"]
      resources: ["payment:*"]
      constraints: {amount_lte: 50000}
    - id: a-support
      subject: {agent: "support-bot"}
      actions: ["stripe.refund"]
      resources: ["payment:*"]
      constraints: {amount_lte: 10000}
    - id: old
      subject: {agent: "support-bot"}
      actions: ["stripe.refund"]
      expires_at: "2026-11-30T00:00:00Z"
    - id: mailer
      subject: {agent: mailer, user: "ops-*"}
      actions: [email.send]
      tasks: ["run-*"]
      environments: [production]
      budgets: [{metric: count, limit: 20, window: PT1H}]
actions: {}
"""


def call(name: str, agent: str, user: str | None = None, resource: str | None = None, environment: str = "production",
         **arguments: object) -> Action:
    return Action(name, arguments, Principal(agent, user), resource=resource, environment=environment)


@pytest.fixture(scope="module")
def authority():
    return parse_policy(GRANTS).authority


def test_the_smallest_passing_id_is_reported(authority) -> None:
    result = authority.evaluate(call("stripe.refund", "support-bot", resource="payment:p1", amount=100), now=NOW)
    assert (result.passed, result.reason, result.grant_id) == (True, "authority_grant", "a-support")
    result = authority.evaluate(call("stripe.refund", "support-bot", resource="payment:p1", amount=20000), now=NOW)
    assert (result.passed, result.grant_id) == (True, "support")


def test_precedence_of_refusals(authority) -> None:
    # 'old' expired, 'support' and 'a-support' fail their constraints: expired outranks constraint.
    result = authority.evaluate(call("stripe.refund", "support-bot", resource="payment:p1", amount=10**9), now=NOW)
    assert (result.passed, result.reason, result.grant_id) == (False, "authority_expired", "old")
    # Without 'old' in play (another agent): constraint, the smallest such id.
    result = authority.evaluate(call("stripe.refund", "support-x", resource="payment:p1", amount=10**9), now=NOW)
    assert (result.reason, result.grant_id) == ("authority_constraint", "support")


def test_no_authority(authority) -> None:
    for action in (call("email.send", "support-bot"),                                  # not its action
                   call("stripe.refund", "mallory", resource="payment:p1", amount=1),  # not its subject
                   call("stripe.refund", "support-x", resource="invoice:1", amount=1),  # not its resource
                   call("stripe.refund", "support-x", amount=1)):                      # no resource at all
        result = authority.evaluate(action, now=NOW)
        assert (result.passed, result.reason, result.grant_id) == (False, "no_authority", None)


def test_expiry_is_inclusive_and_needs_a_clock(authority) -> None:
    at = dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)
    action = call("stripe.refund", "support-bot", amount=1)
    assert authority.evaluate(action, now=at).grant_id == "old"
    assert authority.evaluate(action, now=at + dt.timedelta(microseconds=1)).reason == "authority_expired"
    assert authority.evaluate(action, now=None).reason == "authority_expired"  # no clock: fails closed
    assert authority.has_expiry


def test_tasks_users_and_environments(authority) -> None:
    base = dict(name="email.send", agent="mailer", user="ops-ana")
    assert authority.evaluate(call(**base), now=NOW, task="run-7").passed
    assert authority.evaluate(call(**base), now=NOW, task=None).reason == "authority_task"
    assert authority.evaluate(call(**base), now=NOW, task="job-7").reason == "authority_task"
    assert authority.evaluate(call("email.send", "mailer"), now=NOW, task="run-7").reason == "no_authority"
    assert authority.evaluate(call(**base, environment="staging"), now=NOW, task="run-7").reason == "no_authority"


def test_grants_empty_permits_nothing() -> None:
    authority = parse_policy("schema: ctrlrun.policy/v3\nauthority: {grants: []}\nactions: {}\n").authority
    assert authority.evaluate(call("a", "anyone"), now=NOW).reason == "no_authority"


def test_hash_covers_the_canonical_grants() -> None:
    base = parse_policy(GRANTS)
    reordered = parse_policy(GRANTS.replace('subject: {agent: "support-*"}\n      actions: ["stripe.*"]',
                                            'actions: ["stripe.*"]\n      subject: {agent: "support-*"}'))
    widened = parse_policy(GRANTS.replace("amount_lte: 50000", "amount_lte: 50001"))
    assert base.hash == reordered.hash and base.hash != widened.hash
    assert base.authority.canonical()["grants"]["mailer"]["budgets"] == [
        {"metric": "count", "limit": 20, "window": 3600}]
    no_authority = parse_policy(GRANTS.split("authority:")[0] + "actions: {}\n")
    assert no_authority.hash != base.hash and no_authority.authority is None


@pytest.mark.parametrize(("grant", "fragment"), [
    ('{id: g, subject: {agent: "a*b"}, actions: [x]}', "'*' may only end"),
    ("{id: g, subject: {agent: a}, actions: ['x.**.y']}", "'**' may only be the last"),
    ("{id: g, subject: {agent: a}, actions: [x], resources: ['p:**:q']}", "'**' may only be the last"),
    ("{id: g, subject: {agent: a}, actions: [x], expires_at: '2026-12-01T00:00:00'}", "with an offset"),
    ("{id: g, subject: {agent: a}, actions: [x], expires_at: 'soon'}", "with an offset"),
    ("{id: g, subject: {agent: a}, actions: [x], budgets: [{metric: count, limit: 1}]}", "needs 'window'"),
    ("{id: g, subject: {agent: a}, actions: [x], budgets: [{metric: count, limit: -1, window: P1D}]}", "'limit'"),
    ("{id: g, subject: {agent: a}, actions: [x], budgets: [{metric: count, limit: true, window: P1D}]}", "'limit'"),
    ("{id: g, subject: {agent: a}, actions: [x], budgets: [{metric: count, limit: 1, window: P1M}]}", "no months"),
    ("{id: g, subject: {agent: a}, actions: [x], budgets: [{metric: 'a-b', limit: 1, window: P1D}]}", "'metric'"),
    ("{id: g, subject: {agent: a}, actions: [x], budgets: []}", "non-empty list"),
    ("{id: g, subject: {agent: a}, actions: [x], tasks: ['run:**:x']}", "'**' may only be the last"),
])
def test_bad_grants(grant: str, fragment: str) -> None:
    text = textwrap.dedent(f"""\
        schema: ctrlrun.policy/v7
        authority:
          grants: [{grant}]
        actions: {{}}
        """)
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    assert fragment in str(caught.value) and "line 3" in str(caught.value)
