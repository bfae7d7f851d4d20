"""The calendar's fixtures: a two-slot QPU pool, group A (holders) and outsiders, and windows made
through the service, on a controlled clock (time_machine)."""

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group, Permission

from apps.reservations.models import Reservation, WindowKind
from apps.reservations.services import save_reservation
from tests import factories

#: the example window: 10:00-11:00
TEN = datetime(2030, 3, 4, 10, 0, tzinfo=UTC)
ELEVEN = datetime(2030, 3, 4, 11, 0, tzinfo=UTC)


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2030, 3, 4, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def qpu(db):
    return factories.pool("fresnel", slots_total=2)


@pytest.fixture
def emulator(qpu):
    return factories.device(qpu, "emu")


@pytest.fixture
def operator(django_user_model):
    """Staff with the calendar's permissions (the API's writes)."""
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="reservations"))
    return user


@pytest.fixture
def group_a(db, django_user_model):
    group = Group.objects.create(name="group-a")
    return group


@pytest.fixture
def alice(group_a, django_user_model):
    return factories.user("alice", groups=[group_a])


@pytest.fixture
def outsiders(django_user_model, db):
    return [factories.user(f"out{i}") for i in range(8)]


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
