"""Which roles a request pins (``approver_role``, policy v6): pure, no Django.

A control in the ``controls:`` registry may carry ``approver_role``. A call whose verdict cites such
controls asks for approvers who hold every one of those roles (each approver must hold every role;
§D4). ``required_roles`` reads them from the loaded policy and the verdict, in registry order, once
each. Who holds a role is the store's question (``ctrlrun.store.people``): Django groups or
permissions, as ``settings.CTRLRUN_APPROVER_ROLES`` says.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RequiredRole", "required_roles"]


@dataclass(frozen=True)
class RequiredRole:
    """One role a request pins: the control that asks for it and the role's name, byte for byte."""

    control: str
    role: str

    def as_json(self) -> dict[str, str]:
        return {"control": self.control, "role": self.role}


def required_roles(policy: Any, cited: tuple[str, ...]) -> tuple[RequiredRole, ...]:
    """The roles the controls ``cited`` by a verdict ask of its approvers (``policy.controls``)."""
    found: list[RequiredRole] = []
    for control_id in cited:
        entry = policy.controls.get(control_id)
        role = getattr(entry, "approver_role", None)
        if role and RequiredRole(control_id, role) not in found:
            found.append(RequiredRole(control_id, role))
    return tuple(found)
