"""R-POOL-8 has two writings: ``ResourcePool.objects.visible_to`` (the ORM's) and
``visible_to_sql`` (session admission's hand-written statement, issue 15). They must select the
same pools for every kind of access: public, granted to the user, granted to one of their groups,
staff, and none of these."""

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User
from django.db import connection

from apps.resources.models import ResourcePool, visible_to_sql

pytestmark = pytest.mark.django_db


def pools_by_sql(user) -> set[str]:
    condition, params = visible_to_sql(user, "p")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT p.name FROM {ResourcePool._meta.db_table} p WHERE {condition}", params)  # noqa: S608
        return {name for (name,) in cursor.fetchall()}


def pools_by_orm(user) -> set[str]:
    return set(ResourcePool.objects.visible_to(user).values_list("name", flat=True))


def test_visible_to_sql_selects_the_pools_visible_to_selects_for_every_kind_of_access():
    alice, bob, carol = (User.objects.create_user(name) for name in ("alice", "bob", "carol"))
    admin = User.objects.create_user("admin", is_staff=True)
    team, other_team = Group.objects.create(name="team"), Group.objects.create(name="other-team")
    alice.groups.add(team)
    bob.groups.add(other_team)
    ResourcePool.objects.create(name="open", public=True)
    ResourcePool.objects.create(name="closed")
    ResourcePool.objects.create(name="alice-only").users.add(alice)
    ResourcePool.objects.create(name="team-only").groups.add(team)
    both = ResourcePool.objects.create(name="both")
    both.users.add(bob)
    both.groups.add(team)

    expected = {
        alice: {"open", "alice-only", "team-only", "both"},
        bob: {"open", "both"},
        carol: {"open"},
        admin: {"open", "closed", "alice-only", "team-only", "both"},
        AnonymousUser(): set(),
    }
    for user, names in expected.items():
        assert pools_by_orm(user) == names, user
        assert pools_by_sql(user) == names, user
