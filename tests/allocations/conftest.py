from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from apps.allocations.models import Allocation
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device

DEVICE_TIME = 120.0  # seconds each job takes on the fake device


@pytest.fixture
def qpu(db):
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, strategy="fifo")
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(
        pool=pool, name="fake1", driver="fake", config={"script": ["completed"], "runtime_seconds": DEVICE_TIME}
    )
    return pool


@pytest.fixture
def grant():
    """``grant(pool, user=…|group=…, device_seconds=…, core_hours=…)`` → a fixed allocation
    running from an hour ago for 30 days."""

    def make(pool, *, name="project", **kwargs):
        start = timezone.now() - timedelta(hours=1)
        kwargs.setdefault("starts_at", start)
        kwargs.setdefault("ends_at", start + timedelta(days=30))
        return Allocation.objects.create(name=name, pool=pool, **kwargs)

    return make


@pytest.fixture
def team(member):
    group = Group.objects.create(name="team")
    group.user_set.add(member)
    return group
