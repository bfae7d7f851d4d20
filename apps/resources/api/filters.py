import django_filters

from apps.resources.models import PoolKind, ResourceClass, ResourcePool
from apps.resources.selectors import visible_classes


def visible_pools(request):
    """Filter choices limited to visible pools: checked against every pool, a hidden id would give
    an empty list where a missing one gives a 400, which reveals it (R-POOL-8). Every filter that
    names a pool or a class by id takes its choices from here."""
    if request is None:
        return ResourcePool.objects.none()
    return ResourcePool.objects.visible_to(request.user)


def visible_class_choices(request):
    """:func:`visible_pools` for filters that name a class."""
    if request is None:
        return ResourceClass.objects.none()
    return visible_classes(request.user)


class ResourcePoolFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=PoolKind.choices)
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = ResourcePool
        fields = ["kind", "public", "default", "name", "strategy"]


class ResourceClassFilter(django_filters.FilterSet):
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)

    class Meta:
        model = ResourceClass
        fields = ["pool", "default"]
