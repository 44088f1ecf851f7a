"""The policies several test modules share (``tests/policies/*.yaml``) and the calls protected under them."""
from __future__ import annotations



import ctrlrun

from .base import REPO



# =========================================================================== tests20: shared by several test modules
# (moved here from the test modules that defined them: no test module imports another)

POLICIES = REPO / "tests" / "policies"


def policy_text(name: str) -> str:
    """The text of ``tests/policies/<name>.yaml``, a policy several test modules share."""
    return (POLICIES / f"{name}.yaml").read_text(encoding="utf-8")


#: stripe.refund allowed to 50,000, approved to 1,000,000, denied above; email.send, audit.note, iam.grant_admin.
REFUND_POLICY = policy_text("refund")


def execute_sql(statement: str, params: tuple = ()) -> None:
    """One raw statement in its own transaction, as the application's role could send it."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)


# --------------------------------------------------------------------------- delegation (policies/delegation.yaml)

#: A delegation of the delegation policy's 'support' grant to worker, narrower than its parent.
CHILD = """\
subject: {agent: worker}
actions: [stripe.refund]
resources: ["payment:*"]
constraints: {amount_lte: 1000}
expires_at: "2098-12-31T00:00:00Z"
"""
DELEGABLE_CHILD = CHILD + "delegable: true\n"
GRANDCHILD = CHILD.replace("worker", "helper")


# --------------------------------------------------------------------------- the grants page (policies/grants.yaml)


def grant_refund(payment_id: str, amount: int, executor=lambda: "done"):
    """stripe.refund through the default Control as support-bot (the grants policy's 'support' grant)."""
    from ctrlrun.control import default_control

    return default_control().call("stripe.refund", {"payment_id": payment_id, "amount": amount}, executor,
                                  principal="support-bot")


# --------------------------------------------------------------------------- controls (policies/controls.yaml)

#: The title of the controls policy's ``long-one`` (stripped: the policy's text holds it without the last space).
LONG_TITLE = "Render the primary account number unreadable anywhere it is stored " * 6
CONTROLS_POLICY = policy_text("controls")
OBSERVE_POLICY = CONTROLS_POLICY.replace('version: "2026-12-a"\n', 'version: "2026-12-a"\nmode: observe\n')
BANNER = "OBSERVE MODE — nothing is enforced: every call runs; receipts record what enforcement would have done"


@ctrlrun.protect("email.send", effect="email:{msg_id}")
def send_email(msg_id: str) -> str:
    return f"sent {msg_id}"


@ctrlrun.protect("audit.note")
def note(text: str) -> str:
    return text


#: A policy that governs its own changes (the approved-policy flow, docs/policy-changes.md).
GOVERNED_POLICY = """\
schema: ctrlrun.policy/v6
actions:
  ctrlrun.policy.change:
    decision: approve
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: deny
"""
#: The candidate: refunds up to 5000 are allowed.
WIDER_GOVERNED_POLICY = GOVERNED_POLICY.replace("amount_lte: 1000", "amount_lte: 5000")

#: Two people of the finance group approve a refund above 1000 (verified approvers, M-of-N).
TWO_OF_FINANCE_POLICY = """\
schema: ctrlrun.policy/v6
controls:
  four-eyes: {title: "Two people of finance approve a large refund", approver_role: finance}
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    approvals_required: 2
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: approve
        controls: [four-eyes]
"""
