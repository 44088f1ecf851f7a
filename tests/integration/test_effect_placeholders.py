"""A template placeholder that names no parameter is a wiring mistake: ``protect`` refuses it when
the function is decorated (one line naming the placeholder and the parameters), not at its first
call. The policy's ``effect:`` is checked too when the policy is already in memory (``control=`` a
Control holding a parsed policy); the settings' policy is not read at import for this."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun.control import Control
from ctrlrun.policy import parse_policy
from ctrlrun.protect import plan_for

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment}"
    decision: allow
"""


def test_unknown_effect_placeholder_is_refused_at_decoration():
    decorate = ctrlrun.protect("stripe.refund", effect="refund:{payment}")
    with pytest.raises(ctrlrun.InvalidArgument) as caught:
        @decorate
        def refund(payment_id: str, amount: int) -> None: ...
    message = str(caught.value)
    assert "\n" not in message
    assert message == ("protect('stripe.refund', effect='refund:{payment}'): no parameter named 'payment' "
                       "(refund takes payment_id, amount); a placeholder names a parameter of the function")


@pytest.mark.parametrize("option", ["resource", "task", "hop"])
def test_unknown_placeholder_of_the_other_templates(option):
    with pytest.raises(ctrlrun.InvalidArgument, match=rf"{option}='x:{{nope}}'\): no parameter named 'nope'"):
        @ctrlrun.protect("stripe.refund", **{option: "x:{nope}"})
        def refund(payment_id: str, amount: int) -> None: ...


def test_known_placeholders_and_resource_are_accepted():
    @ctrlrun.protect("stripe.refund", effect="refund:{resource}:{payment_id}", resource="payment:{payment_id}",
                     task="run-{amount}")
    def refund(payment_id: str, amount: int, /) -> None: ...

    assert refund.__ctrlrun__.plan.effect.text == "refund:{resource}:{payment_id}"


def test_the_policy_effect_is_checked_when_the_policy_is_in_memory():
    control = Control(policy=parse_policy(POLICY))
    with pytest.raises(ctrlrun.InvalidArgument) as caught:
        @ctrlrun.protect("stripe.refund", control=control)
        def refund(payment_id: str, amount: int) -> None: ...
    assert str(caught.value) == (
        "protect('stripe.refund'): the policy's effect 'refund:{payment}' has no parameter named 'payment' "
        "(refund takes payment_id, amount); a placeholder names a parameter of the function")

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=control)  # protect's effect wins
    def fine(payment_id: str, amount: int) -> None: ...


def test_a_function_taking_kwargs_accepts_any_placeholder():
    """``protect`` refuses ``**kwargs`` itself (every argument must be visible to the policy), so the
    placeholder check only says so for a programmatic plan: it lets any name through."""
    from ctrlrun.kernel.plans import check_placeholders

    def anything(payment_id: str, **extra: object) -> None: ...

    import inspect

    check_placeholders(plan_for("stripe.refund", {"effect": "refund:{payment}"}), inspect.signature(anything),
                       "anything")
