import django_filters

from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions.api.filters import visible_pools


class JobFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=JobStatus.choices)
    session = django_filters.UUIDFilter(field_name="session_id")
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)

    class Meta:
        model = Job
        fields = ["status", "session", "pool", "device"]


class DeviceFilter(django_filters.FilterSet):
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)

    class Meta:
        model = Device
        fields = ["pool", "driver", "online"]
