"""Builders of the rows most tests need: users, pools with their default class, classes, devices
and sessions. Plain keyword functions (no factory library): each makes exactly what it names,
with the values the fixtures have always used, and takes any other model field as a keyword.

The shared fixtures (``tests/conftest.py``) and the apps' conftests call these instead of
copying ``ResourcePool.objects.create(…)`` and ``ResourceClass.objects.create(…)`` pairs."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device


def user(username: str, *, password: str | None = "pw", groups=(), **fields):  # noqa: S107 - tests' password
    """A user (``password=None``: unusable), member of ``groups`` (Group rows or names)."""
    made = get_user_model().objects.create_user(username, password=password, **fields)
    if groups:
        made.groups.add(
            *[group if isinstance(group, Group) else Group.objects.get_or_create(name=group)[0] for group in groups]
        )
    return made


def resource_class(
    pool: ResourcePool, name: str, *, cpu=1, memory=1, gpu: int = 0, default: bool = False, **fields
) -> ResourceClass:
    return ResourceClass.objects.create(
        pool=pool, name=name, cpu=cpu, memory=memory, gpu=gpu, default=default, **fields
    )


def pool(
    name: str, *, kind: str = "local", public: bool = True, class_name: str = "access", cpu=1, memory=1, gpu=0, **fields
) -> ResourcePool:
    """A pool with one default class (``class_name``, ``cpu``, ``memory``, ``gpu``): the shape every pool
    must have to admit sessions (R-POOL-2). Other keywords are the pool's fields."""
    made = ResourcePool.objects.create(name=name, kind=kind, public=public, **fields)
    resource_class(made, class_name, cpu=cpu, memory=memory, gpu=gpu, default=True)
    return made


def device(pool: ResourcePool, name: str = "fake1", *, driver: str = "fake", config=None, **fields) -> Device:
    return Device.objects.create(pool=pool, name=name, driver=driver, config={} if config is None else config, **fields)


def emulator(pool: ResourcePool, name: str = "emu", **fields) -> Device:
    """An emulator device of Pulser's ``AnalogDevice``."""
    return device(pool, name, driver="emulator", config={"pulser_device": "AnalogDevice"}, **fields)


def session(pool: ResourcePool, user, *, slots: int = 1, resource_class: ResourceClass | None = None, **kwargs):
    """A session admitted through the service (R-SESS-1), on the pool's default class unless
    ``resource_class`` names another; ``kwargs`` go to ``admit`` (``external_id``, …)."""
    from apps.sessions import services

    chosen = resource_class or pool.classes.get(default=True)
    return services.admit(user=user, resource_class=chosen, slots=slots, **kwargs).session
