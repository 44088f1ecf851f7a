"""The humans behind a role (``approver_role``): who holds it, and whether one person does.

``settings.CTRLRUN_APPROVER_ROLES`` says what a role's name means:

- ``"groups"`` (the default): the name of a Django ``auth.Group``; a user holds the role when they
  are an active member of that group (a superuser holds no role by being one: four-eyes rules are
  about named people);
- ``"permissions"``: a permission ``"app_label.codename"``, held as ``user.has_perm`` says (groups,
  user permissions and superusers included, as Django decides).

Reads only; no transaction, no lock.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models import Q

from .. import conf
from .base import alias

__all__ = ["Person", "holders", "holds"]


@dataclass(frozen=True)
class Person:
    username: str
    email: str


def _active_users():
    return get_user_model()._default_manager.db_manager(alias()).filter(is_active=True)


def holders(role: str) -> list[Person]:
    """Every active user who holds ``role``, by username."""
    users = _active_users()
    if conf.approver_roles_from() == "groups":
        users = users.filter(groups__name=role)
    else:
        from django.contrib.auth.models import Permission  # here: a script's embedded store has no auth app

        app_label, _, codename = role.partition(".")
        permission = Permission.objects.db_manager(alias()).filter(codename=codename, content_type__app_label=app_label)
        users = users.filter(Q(is_superuser=True) | Q(user_permissions__in=permission)
                             | Q(groups__permissions__in=permission))
    model = get_user_model()
    return [Person(getattr(u, model.USERNAME_FIELD), getattr(u, model.get_email_field_name(), "") or "")
            for u in users.distinct().order_by(model.USERNAME_FIELD)]


def holds(user: object, role: str) -> bool:
    """Whether this (authenticated, active) user holds ``role`` now."""
    if not getattr(user, "is_active", False) or not getattr(user, "is_authenticated", False):
        return False
    if conf.approver_roles_from() == "groups":
        return user.groups.filter(name=role).exists()  # type: ignore[attr-defined]
    return user.has_perm(role)  # type: ignore[attr-defined]
