"""When a pool's Slurm licence is synced: on the events that change what Slurm may hand out,
coalesced to one sync in flight per pool (docs/qrmi.md, "Slurm licences")."""

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from apps.core.tasks import enqueue
from apps.licences.models import LicenceState
from apps.resources.models import ResourcePool

#: a sync asked for this long ago and not started is taken as lost (a broker outage) and asked again
LOST_AFTER = timedelta(seconds=10)


def request_sync(pool_ids) -> None:
    """Sync these pools' licences soon, once the current transaction commits. A pool whose sync
    is already pending gets none more: the pending one reads the state after this change."""
    now = timezone.now()
    for pool_id in pool_ids:
        idle = Q(pending_since__isnull=True) | Q(pending_since__lt=now - LOST_AFTER)
        flipped = LicenceState.objects.filter(idle, pool_id=pool_id).update(pending_since=now)
        if not flipped:
            _, created = LicenceState.objects.get_or_create(pool_id=pool_id, defaults={"pending_since": now})
            if not created:
                continue  # already pending
        enqueue("apps.licences.tasks.sync_pool", pool_id)


def on_batch_capacity_changed(sender, pool_ids, **kwargs):
    request_sync(pool_ids)


def on_pool_saved(sender, instance, created, raw=False, **kwargs):
    """Its capacity, accessibility or licence may have changed (a pool that has no licence, and
    never had one synced, costs one probe)."""
    if raw:
        return
    if instance.slurm_licence or LicenceState.objects.filter(pool_id=instance.pk).exists():
        request_sync([instance.pk])


def on_device_saved(sender, instance, raw=False, **kwargs):
    """A device came online or went down: the licence closes while none is online."""
    if raw:
        return
    if ResourcePool.objects.filter(pk=instance.pool_id).exclude(slurm_licence="").exists():
        request_sync([instance.pool_id])


def on_pool_deleted(sender, instance, **kwargs):
    """A pool going takes its licence state with it (the cascade): what the sync made in Slurm,
    its licence and the reservations mirroring its calendar, is closed once the deletion
    commits, or Slurm would go on handing out slots of a pool that no longer answers."""
    state = LicenceState.objects.filter(pool_id=instance.pk).first()
    licences = sorted({name for name in (instance.slurm_licence, state.licence if state else "") if name})
    reservations = list(state.reservations) if state else []
    if licences or reservations:
        enqueue("apps.licences.tasks.close_licences", licences, reservations)
