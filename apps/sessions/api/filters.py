import django_filters

from apps.sessions.models import Session, SessionStatus


class SessionFilter(django_filters.FilterSet):
    user = django_filters.CharFilter(field_name="user__username")
    status = django_filters.ChoiceFilter(choices=SessionStatus.choices)

    class Meta:
        model = Session
        fields = ["user", "external_id", "status", "pool"]
