import django_filters

from apps.resources.models import ResourcePool
from apps.sessions.models import Session, SessionStatus


def visible_pools(request):
    """Filter choices limited to visible pools: a 400 for a hidden id would reveal it (R-POOL-8)."""
    if request is None:
        return ResourcePool.objects.none()
    return ResourcePool.objects.visible_to(request.user)


class SessionFilter(django_filters.FilterSet):
    user = django_filters.CharFilter(field_name="user__username")
    status = django_filters.ChoiceFilter(choices=SessionStatus.choices)
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)

    class Meta:
        model = Session
        fields = ["user", "external_id", "status", "pool"]
