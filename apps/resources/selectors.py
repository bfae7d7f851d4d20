"""Read queries shared by the API, the admin and later apps."""

from django.db.models import Prefetch

from apps.resources.models import ResourceClass, ResourcePool


def visible_pools(user):
    """Pools the user may see and use (R-POOL-8), with classes, grants prefetched (no N+1)."""
    return (
        ResourcePool.objects.visible_to(user)
        .prefetch_related(
            Prefetch("classes", queryset=ResourceClass.objects.order_by("name", "id")),
            "users",
            "groups",
        )
        .order_by("name", "id")
    )


def visible_classes(user):
    return ResourceClass.objects.filter(pool__in=ResourcePool.objects.visible_to(user)).select_related("pool")


def can_use_pool(user, pool: ResourcePool) -> bool:
    return ResourcePool.objects.visible_to(user).filter(pk=pool.pk).exists()
