"""The licence sync: a pool's Slurm licence kept equal to the slots Slurm may hand out, and the
pool's calendar mirrored as Slurm reservations of that licence (R-RES-3, ``wanted_reservations``).

**The accounting model.** A session that holds a scheduler job id (``external_id``: a batch
job's, acquired by its prolog or the SPANK plugin) got its slots because its job held the licence:
Slurm already counts them as licences in use. Every other session (REST, the web pages) holds
slots Slurm knows nothing of. So the licence's count is::

    count = slots_total − slots held by active sessions without a scheduler job id

and a job that Slurm started with ``-L <licence>:N`` finds N slots at its acquire: Slurm hands out
at most ``count`` licences, and only sessions of batch jobs, each within its job's licences, take
the rest. Fail closed: while the pool is not "online" (``scheduling.selectors.pool_status``: not
accessible, paused, without a device online and not paused) the count is 0 and ``reason`` says
why. The remaining race: a REST session admitted between a job's start and its prolog's acquire
takes a slot that job was counting on (the job's acquire then gets 409); the count falls as soon
as the session is admitted, so only jobs Slurm had already started can meet it.

**When.** After each admission and release of a non-batch session on a licensed pool, after a
pool or device is saved (``services``), coalesced and off the request path; and every
``GRIDGATE_LICENCE_RECONCILE_SECONDS`` (60) for every licensed pool, which also repairs a count
changed in Slurm by hand. One sync per pool at a time (a lease); a change while one runs makes it
run again. A failing sacctmgr leaves Slurm's count as it is, counts the failure
(``gridgate_licence_sync_failures``, the admin) and is retried by the next event or pass.
"""

import logging
import uuid
from datetime import timedelta

from django.db import DatabaseError
from django.db.models import Sum
from django.utils import timezone

from apps.core.leases import acquire_lease, release_lease
from apps.licences import sacctmgr, scontrol
from apps.licences.models import LicenceState
from apps.licences.sacctmgr import Licence, SlurmError
from apps.reservations.models import Reservation, WindowKind
from apps.reservations.selectors import holders_of
from apps.resources.models import ResourcePool
from apps.scheduling.selectors import pool_status
from apps.sessions.models import Session

log = logging.getLogger(__name__)

LEASE = timedelta(minutes=5)  # longer than a sync's sacctmgr calls take, even timing out
AGAIN = 5  # syncs in a row for changes that arrive while one runs; the next event takes the rest


def wanted(pool: ResourcePool) -> tuple[int, str]:
    """The count the pool's licence should have now, and why (the module's accounting model)."""
    state = pool_status(pool)
    if state.status != "online":
        return 0, f"the pool is {state.status}: {state.reason}"
    if pool.slots_total is None:
        return 0, "the pool counts no slots (slots_total is not set)"
    held = Session.objects.active().filter(pool=pool, external_id="").aggregate(n=Sum("slots"))["n"] or 0
    return max(0, pool.slots_total - held), f"{pool.slots_total} slots, {held} held by sessions of no batch job"


def sync_pool(pool_id: int) -> str:
    """Bring the pool's licence in Slurm to :func:`wanted`; what was done, for the logs."""
    name = f"licence-sync:{pool_id}"
    pending = LicenceState.objects.filter(pool_id=pool_id, pending_since__isnull=False)
    outcome = "nothing to do"
    for _ in range(AGAIN):
        owner = uuid.uuid4().hex
        if not acquire_lease(name, owner, LEASE):
            # Another sync of this pool is running: it runs again for this change.
            LicenceState.objects.filter(pool_id=pool_id).update(pending_since=timezone.now())
            return "running elsewhere"
        try:
            LicenceState.objects.filter(pool_id=pool_id).update(pending_since=None)
            outcome = _sync(pool_id)
        finally:
            release_lease(name, owner)
        # A change during the sync, or between its end and the release (it found the lease held
        # and left itself pending for us), runs it again, looked for once the lease is free.
        if not pending.exists():
            break
    return outcome


def _sync(pool_id: int) -> str:
    pool = ResourcePool.objects.filter(pk=pool_id).first()
    if pool is None:
        return "pool gone"
    state, _ = LicenceState.objects.get_or_create(pool_id=pool_id)
    try:
        if state.licence and state.licence != pool.slurm_licence:
            # Renamed or removed: the old licence hands out nothing more, and its reservations go.
            sacctmgr.set_count(Licence.parse(state.licence), 0)
            for name in state.reservations:
                scontrol.delete(name)
            LicenceState.objects.filter(pk=pool_id).update(licence="", count=None, reservations=[])
            state.reservations = []
        if not pool.slurm_licence:
            return "no licence"
        count, reason = wanted(pool)
        done = sacctmgr.set_count(Licence.parse(pool.slurm_licence), count)
        mirrored = sync_reservations(pool, count, state.reservations)
        if mirrored:
            done = f"{done}; reservations: {mirrored}" if done != "unchanged" else f"reservations: {mirrored}"
    except SlurmError as exc:
        LicenceState.objects.filter(pk=pool_id).update(error=str(exc)[:1000], failures=state.failures + 1)
        log.warning("pool %s: licence %s not synced: %s", pool.name, pool.slurm_licence or state.licence, exc)
        return "failed"
    LicenceState.objects.filter(pk=pool_id).update(
        licence=pool.slurm_licence, count=count, reason=reason, synced_at=timezone.now(), error="", failures=0
    )
    if done != "unchanged":
        log.info("pool %s: licence %s count %s (%s): %s", pool.name, pool.slurm_licence, count, done, reason)
    return done


def wanted_reservations(pool: ResourcePool, count: int, now=None) -> list[scontrol.Wanted]:
    """R-RES-3: the Slurm reservations the pool's calendar wants now, one per live window that
    has not ended, of the pool's licence (``count``: what the licence holds now, which no
    reservation may pass):

    - a reservation holds its slots but those its holders' sessions of no batch job hold of it
      (Slurm already counts them out of the licence), for its holders' Unix accounts;
    - a maintenance window of the pool, or of its only device, holds all of the licence
      (``flags=maint``); one of a device among several holds nothing in Slurm (the others work).
    """
    now = now or timezone.now()
    windows = list(Reservation.objects.live().filter(pool=pool, end__gt=now).order_by("start", "id"))
    for window in windows:
        window.pool = pool  # its Slurm name is its licence's
    if not windows:
        return []
    from apps.qrmi.models import UnixAccount

    reservations = [w for w in windows if w.kind == WindowKind.RESERVATION]
    holders = holders_of(reservations)
    accounts = {}
    everyone = set().union(*holders.values()) if holders else set()
    for user_id, uid in UnixAccount.objects.filter(user_id__in=everyone, unix_uid__isnull=False).values_list(
        "user_id", "unix_uid"
    ):
        name = scontrol.account_name(uid)
        if name:
            accounts[user_id] = name
    outside_slurm = dict(
        Session.objects.active()
        .filter(reservation__in=reservations, external_id="")
        .values("reservation")
        .annotate(n=Sum("reserved_slots"))
        .values_list("reservation", "n")
    )
    devices = pool.devices.count()
    out = []
    for window in windows:
        if window.kind == WindowKind.MAINTENANCE:
            if window.device_id is not None and devices > 1:
                continue
            slots, users = pool.slots_total or 0, (scontrol.operator(),)
        else:
            slots = max(window.slots - (outside_slurm.get(window.pk) or 0), 0)
            users = tuple(sorted({accounts[u] for u in holders[window.pk] if u in accounts})) or (scontrol.operator(),)
        licences = f"{pool.slurm_licence}:{min(slots, count)}"
        out.append(scontrol.Wanted(window.slurm_name, window.start, window.end, users, licences, window.is_maintenance))
    return out


def sync_reservations(pool: ResourcePool, count: int, mirrored: list[str]) -> str:
    """Create, change and remove the pool's Slurm reservations so that they are
    :func:`wanted_reservations`; what was done ('' for nothing). Asks Slurm nothing while the
    pool has no window and mirrored none."""
    wanted = {w.name: w for w in wanted_reservations(pool, count)}
    if not wanted and not mirrored:
        return ""
    now = timezone.now()
    present = scontrol.present()
    done = []
    for name, want in wanted.items():
        have = present.get(name)
        if have is None:
            scontrol.create(want, now=now)
            done.append(f"created {name}")
        elif scontrol.differs(want, have):
            scontrol.update(want, have)
            done.append(f"changed {name}")
    for name in mirrored:
        if name not in wanted and name in present:
            scontrol.delete(name)  # cancelled, moved to another pool, or no longer mirrored
            done.append(f"removed {name}")
    LicenceState.objects.filter(pk=pool.pk).update(reservations=sorted(wanted))
    return ", ".join(done)


def reconcile() -> dict:
    """Every licensed pool synced (drift repaired); on a database outage, every licence Gridgate
    made is closed (count 0) instead: Slurm must not start jobs whose acquire cannot be answered."""
    try:
        pool_ids = list(ResourcePool.objects.exclude(slurm_licence="").values_list("pk", flat=True)) + list(
            LicenceState.objects.exclude(licence="").values_list("pool_id", flat=True)
        )
    except DatabaseError as exc:
        return {"closed": close_all(f"Gridgate's database cannot be reached: {exc}")}
    outcomes = {}
    for pool_id in sorted(set(pool_ids)):
        outcomes[pool_id] = sync_pool(pool_id)
    return outcomes


def close_deleted(licences: list[str], reservations: list[str]) -> None:
    """A deleted pool's licences set to 0 and its mirrored reservations removed
    (``services.on_pool_deleted``): no state of it is left for the sync to read."""
    for name in reservations:
        scontrol.delete(name)
    for licence in licences:
        sacctmgr.set_count(Licence.parse(licence), 0)


def close_all(reason: str) -> list[str]:
    """Set every licence Gridgate made to 0 (fail closed)."""
    closed = []
    for licence in sacctmgr.ours():
        try:
            sacctmgr.set_count(licence, 0)
            closed.append(str(licence))
        except SlurmError as exc:
            log.error("licence %s could not be closed: %s", licence, exc)
    log.error("closed %d Slurm licence(s): %s", len(closed), reason)
    return closed


def calendar_check() -> tuple[bool, str]:
    """doctor (R-RES-3): every live window of a licensed pool is in Slurm as the calendar wants
    it (a drift names the window and how to repair it); scontrol is asked only when one exists."""
    pools = list(
        ResourcePool.objects.exclude(slurm_licence="")
        .filter(reservations__cancelled_at__isnull=True, reservations__end__gt=timezone.now())
        .distinct()
    )
    if not pools:
        return True, "no window of a licensed pool to mirror"
    ok, message = scontrol.check()
    if not ok:
        return ok, message
    present = scontrol.present()
    drift = []
    for pool in pools:
        state = LicenceState.objects.filter(pool=pool).first()
        count = state.count if state is not None and state.count is not None else wanted(pool)[0]
        for want in wanted_reservations(pool, count):
            have = present.get(want.name)
            if have is None or scontrol.differs(want, have):
                drift.append(f"{pool.name}: {want.name} {'missing' if have is None else 'differs'}")
    if drift:
        return False, (
            f"Slurm reservations out of step with the calendar: {'; '.join(drift)}. Run `manage.py sync_licences` "
            "(the reconcile pass repairs it within GRIDGATE_LICENCE_RECONCILE_SECONDS; see the sync's error on "
            "the admin's Slurm licences page if it does not)"
        )
    return True, f"{message}; every window of the licensed pools is in Slurm"
