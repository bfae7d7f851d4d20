import django_filters

from apps.scheduling.models import Device, Job, JobStatus


class JobFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=JobStatus.choices)
    session = django_filters.UUIDFilter(field_name="session_id")

    class Meta:
        model = Job
        fields = ["status", "session", "pool", "device"]


class DeviceFilter(django_filters.FilterSet):
    class Meta:
        model = Device
        fields = ["pool", "driver", "online"]
