"""R-POOL-8: who sees and may use which pool, for every kind of access (public, granted to the
user, granted to one of their groups, staff, none of these), through the ORM's ``visible_to`` and
through session admission, whose class lookup uses the same rule (``visible_pools_sql``)."""

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User

from apps.resources.models import ResourceClass, ResourcePool
from apps.sessions import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def access():
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
    for pool in ResourcePool.objects.all():
        ResourceClass.objects.create(pool=pool, name="small", cpu=1, memory=1, default=True)
    return {
        alice: {"open", "alice-only", "team-only", "both"},
        bob: {"open", "both"},
        carol: {"open"},
        admin: {"open", "closed", "alice-only", "team-only", "both"},
    }


def test_visible_to_selects_public_granted_and_group_granted_pools_and_staff_sees_all(access):
    for user, names in access.items():
        assert set(ResourcePool.objects.visible_to(user).values_list("name", flat=True)) == names, user
    assert not ResourcePool.objects.visible_to(AnonymousUser()).exists()


def test_admission_admits_on_exactly_the_pools_the_user_may_use(access):
    for user, names in access.items():
        for pool in ResourcePool.objects.all():
            choice = services.UsableClass(pool_name=pool.name)
            if pool.name in names:
                assert services.admit(user=user, resource_class=choice).created, (user, pool)
            else:
                with pytest.raises(services.NoSuchClass):
                    services.admit(user=user, resource_class=choice)


def test_visible_to_works_inside_a_subquery(access):
    """The rule is a self-contained subquery: it stays right where the ORM nests the pool table."""
    alice = User.objects.get(username="alice")
    classes = ResourceClass.objects.filter(pool__in=ResourcePool.objects.visible_to(alice))
    assert set(classes.values_list("pool__name", flat=True)) == access[alice]


def test_filtering_classes_by_a_hidden_pool_answers_as_for_a_pool_that_does_not_exist(api, outsider, private_pool):
    """``?pool=`` on the class list was checked against every pool (a hidden one: an empty list; a
    missing id: a 400), so the answer told which private pools exist."""
    client = api(outsider)
    url = "/api/v1/resource-classes/?pool={}"
    answers = [client.get(url.format(pk)) for pk in (private_pool.pk, private_pool.pk + 1000)]
    assert answers[0].status_code == answers[1].status_code
    assert answers[0].json() == answers[1].json()
