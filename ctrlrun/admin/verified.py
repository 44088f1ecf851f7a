"""The console's half of verified approvers and M-of-N (§D4/§D5): what a request still needs, and
whether the person looking may give it.

The console is a verifying surface: it knows ``request.user``, and each answer there is recorded by
the store as a verified approver (``store.answer_approval(person=request.user)``). Who holds a role
is ``store.people.holds``. The store checks again, in the transaction that records the answer.
"""
from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _g
from django.utils.translation import ngettext

from ..display import reveal
from ..identity import same_person
from ..store.people import holds
from .console import shown, when


def pins_anything(approval: Any) -> bool:
    return bool(approval.required_roles) or approval.approvals_required > 1 or bool(approval.approvers)


def box(approval: Any, user: Any) -> dict[str, Any] | None:
    """The page's "approvals" lines: "1 of 2 approvals", by whom, the roles each approver must hold,
    what is still needed, and whether ``user`` already gave theirs or lacks a role. None when the
    request pins nothing and nobody verified answered it (an ordinary one-person request)."""
    if not pins_anything(approval):
        return None
    username = user.get_username()
    recorded = approval.approvals_recorded
    return {
        "tally": approval.tally,
        "approvers": [{"user": shown(a.user), "at": when(_parse(a.granted_at))} for a in approval.approvers],
        "roles": [{"role": shown(r.role), "control": shown(r.control)} for r in approval.required_roles],
        "still_needed": max(approval.approvals_required - recorded, 0),
        "you_approved": any(same_person(a.user, username) for a in approval.approvers),
        "you_lack": [shown(r.role) for r in approval.required_roles if not holds(user, r.role)],
    }


def _parse(text: str) -> Any:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def refusal(approval: Any, user: Any) -> str | None:
    """Why ``user`` may not approve ``approval`` (they already did; they lack a pinned role), or None."""
    username = user.get_username()
    if any(same_person(a.user, username) for a in approval.approvers):
        return _g("You already approved request %(id)s (%(tally)s); another person must give the next "
                  "approval") % {"id": approval.approval_id, "tally": approval.tally}
    for role in approval.required_roles:
        if not holds(user, role.role):
            return _g("You do not hold the role %(role)s that control %(control)s requires of every approver of "
                      "request %(id)s; a person who holds it must approve") % {
                "role": repr(reveal(role.role)), "control": repr(reveal(role.control)), "id": approval.approval_id}
    return None


def recorded_message(result: Any) -> str:
    """What an approver is told when their approval is recorded and the request still waits."""
    more = max(result.approvals_required - result.approvals_recorded, 0)
    roles = ", ".join(reveal(r.role) for r in result.required_roles)
    text = _g("Your approval of request %(id)s is recorded: %(tally)s.") % {"id": result.approval_id,
                                                                          "tally": result.tally}
    if roles:
        text += " " + ngettext("It still needs %(n)d more person who holds %(roles)s",
                               "It still needs %(n)d more people who hold %(roles)s", more) % {"n": more, "roles": roles}
    else:
        text += " " + ngettext("It still needs %(n)d more person", "It still needs %(n)d more people", more) % {
            "n": more}
    return text + _g("; the agent's call stays blocked until then.")
