import django_filters

from apps.resources.api.filters import visible_pools
from apps.sessions.models import Session, SessionStatus


class SessionFilter(django_filters.FilterSet):
    user = django_filters.CharFilter(field_name="user__username")
    status = django_filters.ChoiceFilter(choices=SessionStatus.choices)
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)

    class Meta:
        model = Session
        fields = ["user", "external_id", "status", "pool"]
