"""Operational status of devices with a provider (pasqal_qpu, pasqal_cloud), SPEC §5.

The worker asks each such device's provider on a cadence (``GRIDGATE_DEVICE_STATUS_INTERVAL``
seconds, registered on the tick loop); a request never does, so a slow or unreachable QPU never
slows an API call. The answer is recorded on the device: ``provider_status`` and its message,
the provider's specs (what sequences are validated against and what ``/specs/`` and QRMI
``target()`` return), and ``online``: DOWN or unreachable takes the device offline (its jobs wait,
``pending_reason`` "device down"), UP brings it back and wakes the dispatcher.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.tasks import enqueue
from apps.scheduling.drivers import ProviderStatus, get_driver
from apps.scheduling.models import Device, DriverName
from apps.scheduling.services import wake_pool

log = logging.getLogger(__name__)

PROVIDER_DRIVERS = (DriverName.PASQAL_QPU, DriverName.PASQAL_CLOUD)


def record_status(device: Device, status: ProviderStatus) -> None:
    """Write what the provider said; flip ``online`` only when the provider's own status
    changes, so an operator who takes an UP device offline by hand is not overridden by the
    next check (and one who brings a DOWN device online is corrected by it)."""
    now = timezone.now()
    with transaction.atomic():
        locked = Device.objects.select_for_update().get(pk=device.pk)
        previous = locked.provider_status
        locked.provider_status = status.status
        locked.provider_message = status.message[:500]
        locked.provider_checked_at = now
        fields = ["provider_status", "provider_message", "provider_checked_at"]
        if status.specs is not None:
            locked.provider_specs = status.specs
            locked.provider_specs_text = status.specs_text
            fields += ["provider_specs", "provider_specs_text"]
        came_online = False
        if status.status == "up" and previous != "up":
            came_online = not locked.online
            locked.online = True
            fields.append("online")
        elif status.status != "up" and locked.online:
            locked.online = False
            fields.append("online")
        locked.save(update_fields=fields)
        if came_online:
            wake_pool(locked.pool_id)  # R-SCHED-5: device back online
    if previous != status.status:
        log.warning(
            "device %s: provider status %s → %s (%s)", device, previous or "unknown", status.status, status.message
        )
    for name in (
        "provider_status",
        "provider_message",
        "provider_checked_at",
        "provider_specs",
        "provider_specs_text",
        "online",
    ):
        setattr(device, name, getattr(locked, name))


def check_device(device: Device) -> str:
    """Ask the device's provider now (worker only) and record the answer."""
    try:
        status = get_driver(device.driver).check_status(device)
    except Exception as exc:  # a driver bug must not stop the pass for the other devices
        log.exception("status check of device %s failed", device)
        status = ProviderStatus("unreachable", message=f"status check failed: {type(exc).__name__}")
    if status is None:
        return ""
    record_status(device, status)
    return status.status


def due_devices():
    every = timedelta(seconds=settings.GRIDGATE_DEVICE_STATUS_INTERVAL)
    stale = Q(provider_checked_at__isnull=True) | Q(provider_checked_at__lt=timezone.now() - every)
    return Device.objects.filter(stale, driver__in=PROVIDER_DRIVERS)


def enqueue_checks() -> int:
    """The tick pass: one task per device due for a check, so a slow provider holds a worker,
    not the tick loop that also runs the dispatcher's sweep."""
    ids = list(due_devices().values_list("id", flat=True))
    for device_id in ids:
        enqueue("apps.scheduling.tasks.check_device_status", device_id)
    return len(ids)
