"""Access withdrawn from any path (R-POOL-8): the pool's grants (its users and groups, on the
API, the admin or in code), a user's groups, a group deleted, the pool made private, the account
deactivated or no longer staff. Each change ends, once its transaction has committed, the active
sessions whose owner may no longer use their pool (``services.end_sessions_without_access``)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from apps.resources.models import ResourcePool

#: the user's fields that change what they may use
ACCESS_FIELDS = {"is_active", "is_staff"}


def _after_commit(**narrowed) -> None:
    from apps.sessions.services import end_sessions_without_access

    transaction.on_commit(lambda: end_sessions_without_access(**narrowed))


def grants_changed(sender, instance, action, model, pk_set, **kwargs):
    """A grant or a membership removed (``remove``, ``clear``; ``set`` removes too)."""
    if action not in ("post_remove", "post_clear"):
        return
    if isinstance(instance, ResourcePool):
        _after_commit(pool_ids=[instance.pk])
    elif isinstance(instance, Group):  # a group's members or its pools, changed from the group's side
        key = "pool_ids" if model is ResourcePool else "user_ids"
        _after_commit(**({key: sorted(pk_set)} if pk_set else {}))
    else:  # a user's groups or grants
        _after_commit(user_ids=[instance.pk])


def pool_saved(sender, instance, created, update_fields=None, **kwargs):
    if not created and not instance.public and (update_fields is None or "public" in update_fields):
        _after_commit(pool_ids=[instance.pk])


def user_saved(sender, instance, created, update_fields=None, **kwargs):
    if not created and (update_fields is None or ACCESS_FIELDS & set(update_fields)):
        _after_commit(user_ids=[instance.pk])


def group_deleted(sender, instance, **kwargs):
    _after_commit()


def connect():
    user_model = get_user_model()
    for through in (ResourcePool.users.through, ResourcePool.groups.through, user_model.groups.through):
        m2m_changed.connect(grants_changed, sender=through, dispatch_uid=f"sessions.access.{through.__name__}")
    post_save.connect(pool_saved, sender=ResourcePool, dispatch_uid="sessions.access.pool")
    post_save.connect(user_saved, sender=user_model, dispatch_uid="sessions.access.user")
    post_delete.connect(group_deleted, sender=Group, dispatch_uid="sessions.access.group")
