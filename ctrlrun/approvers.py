"""Verified approvers and M-of-N (policy v6 ``approver_role`` and ``approvals_required``, §D4/§D5): pure.

A request pins what its call required when it was asked: ``required_roles`` (``ctrlrun.roles``:
each a control and the role it asks of approvers) and ``approvals_required`` (N, 1 unless the
policy says more). A surface that knows *who* answered (the console knows ``request.user``) records
each grant as a :class:`VerifiedApprover`; the same person twice (``identity.same_person``) counts
once, and the request is granted when N distinct people have. A surface that verifies nobody (the
``approve`` command, a webhook) can still grant a request that pins nothing, as before; under a role
or N above 1 its answer counts toward nothing.

When the call uses the grant, :func:`problem` checks the row again, so a grant that does not meet
what the call requires now is refused and left granted (``ApprovalMismatch(reason=...)``):

- ``approval_unrecorded``: the row does not pin what the call requires (a role or a count more than
  it pinned: the request was made under another policy, or before these columns existed);
- ``approver_unverified``: fewer verified approvers than required (none, for a role);
- ``approver_unentitled``: an approver lacks one of the pinned roles (each must hold every one);
- ``approver_is_requester``: an approver is the person the call was made for (users compared with
  ``same_person``, whatever agent name either used: stronger than the reference's (agent, user)
  pair, see docs/reference-differences.md).

No Django, no database: the store reads and writes the columns and calls these.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument
from .identity import same_person
from .roles import RequiredRole

__all__ = ["VerifiedApprover", "dump_approvers", "load_approvers", "dump_roles", "load_roles", "distinct",
           "needs_verification", "problem", "tally", "CONSOLE_AGENT", "CONSOLE_ISSUER", "ClaimedPerson",
           "ApproverIdentity"]

#: What the console records as the approver's agent and issuer: the Django admin, which authenticated them.
CONSOLE_AGENT, CONSOLE_ISSUER = "console", "django"


@dataclass(frozen=True)
class VerifiedApprover:
    """One person a verifying surface saw grant a request: the surface's agent name, the person's user
    name (as the surface authenticated it), who vouches for it (``issuer``), the control ids whose
    role they held when they answered (``entitled``), and when (ISO text, the store's clock)."""

    agent: str
    user: str
    issuer: str
    entitled: tuple[str, ...]
    granted_at: str

    def as_json(self) -> dict[str, Any]:
        return {"agent": self.agent, "user": self.user, "issuer": self.issuer, "entitled": list(self.entitled),
                "granted_at": self.granted_at}


@dataclass(frozen=True)
class ApproverIdentity:
    """How the people who answer a Control's requests are verified outside the console (§D4): an
    identity provider of their own (never the agent's) and the claim of its principals that lists
    their roles (``roles_claim``; None: no role can be satisfied through it). Giving one to
    ``Control(approver_identity=...)`` says "a verifying surface answers these requests" (e.g.
    ``ctrlrun mcp-operator`` with the same provider), so M-of-N requests are asked rather than refused
    ``approvals_unverifiable``; the answers themselves are still verified where they are given."""

    provider: Any
    roles_claim: str | None = None

    def __post_init__(self) -> None:
        if not callable(getattr(self.provider, "resolve", None)):
            raise InvalidArgument(f"ApproverIdentity(provider=...): {self.provider!r} is not an identity provider "
                                  f"(it needs resolve(context); see ctrlrun.identity)")
        if self.roles_claim is not None and (not isinstance(self.roles_claim, str) or not self.roles_claim.strip()):
            raise InvalidArgument(f"ApproverIdentity(roles_claim=...) must name a claim, got {self.roles_claim!r}")


@dataclass(frozen=True)
class ClaimedPerson:
    """A person an identity provider verified (``mcp-operator``): the principal's agent and user, the
    issuer that vouches for them, and the roles their credential's claims name (matched byte for byte
    against ``approver_role``). The store records their grant as a :class:`VerifiedApprover`."""

    agent: str
    user: str
    issuer: str
    roles: frozenset[str]
    via: str


def dump_approvers(approvers: tuple[VerifiedApprover, ...] | list[VerifiedApprover]) -> str:
    return json.dumps([a.as_json() for a in approvers], ensure_ascii=False, separators=(",", ":"))


def load_approvers(text: str | None) -> tuple[VerifiedApprover, ...]:
    """The ``approvers`` column read back (a signed row's: the store checks the signature first)."""
    return tuple(VerifiedApprover(item["agent"], item["user"], item["issuer"], tuple(item["entitled"]),
                                  item["granted_at"]) for item in json.loads(text or "[]"))


def dump_roles(roles: tuple[RequiredRole, ...]) -> str:
    return json.dumps([r.as_json() for r in roles], ensure_ascii=False, separators=(",", ":"))


def load_roles(text: str | None) -> tuple[RequiredRole, ...]:
    return tuple(RequiredRole(item["control"], item["role"]) for item in json.loads(text or "[]"))


def distinct(approvers: tuple[VerifiedApprover, ...]) -> tuple[VerifiedApprover, ...]:
    """One entry per person (``same_person`` on the user; the latest entry of a person kept in the
    place of their first), in the order they first answered."""
    kept: list[VerifiedApprover] = []
    for approver in approvers:
        for index, seen in enumerate(kept):
            if same_person(seen.user, approver.user):
                kept[index] = approver
                break
        else:
            kept.append(approver)
    return tuple(kept)


def needs_verification(roles: tuple[RequiredRole, ...], count: int) -> bool:
    """Whether only verified approvers can grant such a request (a role pinned, or N above 1)."""
    return bool(roles) or count > 1


def tally(recorded: int, required: int) -> str:
    """``"1 of 2 approvals"``: the wording of the command, the console and the store's answer."""
    return f"{recorded} of {required} approval{'s' if required != 1 else ''}"


def problem(*, pinned_roles: tuple[RequiredRole, ...], pinned_count: int, approvers: tuple[VerifiedApprover, ...],
            required_roles: tuple[RequiredRole, ...], required_count: int,
            requester: str | None) -> tuple[str, str] | None:
    """Why a granted row may not be used by a call requiring ``required_roles`` and
    ``required_count`` for ``requester`` (reason code, sentence), or None. Checked in this order."""
    missing = [r for r in required_roles if r not in pinned_roles]
    if missing or required_count > pinned_count:
        wanted = ", ".join(f"{r.role!r} ({r.control})" for r in missing) or f"{required_count} approvals"
        return "approval_unrecorded", (f"the request does not record what this call requires ({wanted}); it was "
                                       f"asked under other rules: ask again")
    if not needs_verification(pinned_roles, pinned_count):
        return None
    people = distinct(approvers)
    if len(people) < max(pinned_count, 1):
        return "approver_unverified", (f"the request has {tally(len(people), max(pinned_count, 1))} from verified "
                                       f"approvers (an answer through the command or a webhook verifies nobody); "
                                       f"have a person answer in the console")
    for person in people:
        lacking = [r for r in pinned_roles if r.control not in person.entitled]
        if lacking:
            return "approver_unentitled", (f"approver {person.user!r} did not hold the role "
                                           f"{lacking[0].role!r} that control {lacking[0].control!r} requires")
    for person in people:
        if same_person(person.user, requester):
            return "approver_is_requester", (f"approver {person.user!r} is the person this call is made for "
                                             f"({requester!r}); someone else must approve it")
    return None
