import django_filters

from apps.resources.models import PoolKind, ResourceClass, ResourcePool


class ResourcePoolFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=PoolKind.choices)
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = ResourcePool
        fields = ["kind", "public", "default", "name", "strategy"]


class ResourceClassFilter(django_filters.FilterSet):
    class Meta:
        model = ResourceClass
        fields = ["pool", "default"]
