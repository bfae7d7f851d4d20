"""The calendar's fixtures: a two-slot QPU pool, group A (holders) and outsiders, and windows made
through the service, on a controlled clock (time_machine)."""

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group

from apps.reservations.models import Reservation, WindowKind
from apps.reservations.services import save_reservation
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device

#: the example window: 10:00-11:00
TEN = datetime(2030, 3, 4, 10, 0, tzinfo=UTC)
ELEVEN = datetime(2030, 3, 4, 11, 0, tzinfo=UTC)


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2030, 3, 4, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def qpu(db):
    pool = ResourcePool.objects.create(name="fresnel", kind="local", public=True, slots_total=2)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    return pool


@pytest.fixture
def emulator(qpu):
    return Device.objects.create(pool=qpu, name="emu", driver="fake", config={})


@pytest.fixture
def group_a(db, django_user_model):
    group = Group.objects.create(name="group-a")
    return group


@pytest.fixture
def alice(group_a, django_user_model):
    user = django_user_model.objects.create_user("alice", password="pw")
    user.groups.add(group_a)
    return user


@pytest.fixture
def outsiders(django_user_model, db):
    return [django_user_model.objects.create_user(f"out{i}", password="pw") for i in range(8)]


@pytest.fixture
def reserve(db):
    def make(pool, *, start=TEN, end=ELEVEN, slots=1, users=(), groups=(), kind=WindowKind.RESERVATION, **more):
        return save_reservation(
            Reservation(
                pool=pool, kind=kind, start=start, end=end, slots=slots, title=more.pop("title", "Run"), **more
            ),
            users=list(users),
            groups=list(groups),
        )

    return make
