"""What the licence sync last did for each pool with a Slurm licence (docs/qrmi.md)."""

from django.db import models

from apps.resources.models import ResourcePool


class LicenceState(models.Model):
    """The sync's record for one pool: what it pushed to Slurm and why, and whether sacctmgr
    answered. Written only by the sync (``apps.licences.passes``); read by the admin, the
    ``sync_licences`` command and ``/metrics``."""

    pool = models.OneToOneField(ResourcePool, on_delete=models.CASCADE, primary_key=True, related_name="licence_state")
    licence = models.CharField(max_length=64, blank=True, default="", help_text="name@server as last pushed.")
    count = models.IntegerField(null=True, blank=True, help_text="The count Slurm holds, as last set or read.")
    reason = models.CharField(
        max_length=500, blank=True, default="", help_text="Why the count is what it is (why 0, when it is)."
    )
    synced_at = models.DateTimeField(null=True, blank=True, help_text="The last time Slurm held the wanted count.")
    error = models.CharField(max_length=1000, blank=True, default="", help_text="sacctmgr's last failure, if failing.")
    failures = models.PositiveIntegerField(default=0, help_text="Failed syncs in a row (0 when the last one worked).")
    # R-RES-3: the Slurm reservations (names) this pool's calendar has in Slurm, as last synced;
    # a pool with none and no live window never runs scontrol.
    reservations = models.JSONField(default=list, blank=True)
    # Coalesced sync: set by the request that changed the usage, cleared by the sync before it
    # reads; a change after the clear sets it again and enqueues another sync. A sync asked for
    # longer than ``services.LOST_AFTER`` ago whose task was lost is asked for again.
    pending_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pool_id"]

    def __str__(self):
        return f"{self.licence or '(no licence)'}: {self.count}"
