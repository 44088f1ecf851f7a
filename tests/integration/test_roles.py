"""Who holds an approver_role: Django groups by default, permissions when the setting says so."""
import pytest
from django.contrib.auth.models import Group, Permission, User

from ctrlrun import store
from ctrlrun.errors import InvalidArgument
from ctrlrun.policy.model import ControlEntry
from ctrlrun.roles import RequiredRole, required_roles

pytestmark = pytest.mark.django_db


class _Policy:
    controls = {"c1": ControlEntry("c1", "t", approver_role="finance"), "c2": ControlEntry("c2", "t"),
                "c3": ControlEntry("c3", "t", approver_role="risk")}


def test_required_roles_come_from_the_cited_controls_in_order_once_each():
    assert required_roles(_Policy, ("c3", "c2", "c1", "c1")) == (RequiredRole("c3", "risk"), RequiredRole("c1", "finance"))
    assert required_roles(_Policy, ()) == ()


def test_groups_name_roles_and_only_active_members_hold_them():
    finance = Group.objects.create(name="finance")
    alice = User.objects.create_user("alice", "alice@example.test")
    bob = User.objects.create_user("bob", "bob@example.test", is_active=False)
    User.objects.create_superuser("root", "root@example.test")
    finance.user_set.add(alice, bob)
    assert [p.username for p in store.people.holders("finance")] == ["alice"]
    assert store.people.holds(alice, "finance") and not store.people.holds(bob, "finance")
    assert not store.people.holds(User.objects.get(username="root"), "finance")
    assert store.people.holders("Finance") == []  # byte for byte


def test_permissions_name_roles_when_the_setting_says_so(settings):
    settings.CTRLRUN_APPROVER_ROLES = "permissions"
    carol = User.objects.create_user("carol", "carol@example.test")
    carol.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    carol = User.objects.get(pk=carol.pk)
    assert store.people.holds(carol, "ctrlrun.decide_approval")
    assert "carol" in [p.username for p in store.people.holders("ctrlrun.decide_approval")]


def test_an_unknown_setting_is_refused_with_what_to_write(settings):
    settings.CTRLRUN_APPROVER_ROLES = "teams"
    with pytest.raises(InvalidArgument, match="'groups' or 'permissions'"):
        store.people.holders("finance")
