import django_filters

from apps.resources.api.filters import visible_pools
from apps.resources.models import ResourcePool
from apps.scheduling.models import Device, Job, JobStatus


def visible_devices(request):
    """The devices of visible pools (``resources.api.filters.visible_pools``: R-POOL-8)."""
    if request is None:
        return Device.objects.none()
    return Device.objects.filter(pool__in=ResourcePool.objects.visible_to(request.user))


class JobFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=JobStatus.choices)
    session = django_filters.UUIDFilter(field_name="session_id")
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)
    device = django_filters.ModelChoiceFilter(queryset=visible_devices)

    class Meta:
        model = Job
        fields = ["status", "session", "pool", "device"]


class DeviceFilter(django_filters.FilterSet):
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)

    class Meta:
        model = Device
        fields = ["pool", "driver", "online"]
