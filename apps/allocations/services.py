"""Charging allocations (R-ALLOC-1): each job its device time, each case cores × run time,
exactly once, and the checks that queue or refuse work at the limit.

Exactly once lives in the database: a charge is an ``INSERT … ON CONFLICT DO NOTHING`` into
the ledger (unique on the job, and on the case), and only a row actually inserted adds to its
allocation, with one ``used = used + x`` UPDATE of the allocation's own row, in the same
transaction as the job's (or case's) record step. Two workers recording the same end, or a
retried pass, insert nothing the second time and add nothing.

A charge that takes a period's spending across 80 % or 100 % of a limited grant tells the
project's members (R-NOTE-1) in the same transaction: the outbox's unique key (subscription,
event, subject ``allocation:<id>:<period>:<resource>``) makes it once per period and threshold.
"""

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Case, F, Sum, Value, When

from apps.allocations import selectors
from apps.allocations.models import INFINITY, Allocation, Charge, ChargeKind
from apps.core.exceptions import Conflict, NotFound
from apps.core.rows import insert_values
from apps.notifications.models import Event
from apps.notifications.outbox import notify_many

#: the shares of a grant whose crossing its project is told of (R-NOTE-1)
THRESHOLDS = {80: Event.ALLOCATION_80, 100: Event.ALLOCATION_100}
UNITS = {"device_seconds": ("device time", 3600, "h"), "core_hours": ("case core-hours", 1, "core-h")}


# -- choosing -----------------------------------------------------------------------------------
def choose_for_session(*, user, pool_id: int, allocation_id=None, now) -> Allocation | None:
    """The allocation a new session on the pool spends: the one named (it must be one of
    ``user``'s on that pool, else 404), or the user's default (``selectors.preferred``), or
    None: a user with no project on the pool, or a pool with no allocations, is not limited."""
    if allocation_id is None:
        return selectors.default_for(user.pk, pool_id, now)
    found = Allocation.objects.filter(selectors.of_user(user.pk), pool_id=pool_id, pk=allocation_id).first()
    if found is None:
        raise NotFound("No such allocation of yours on this pool.")
    return found


def check_case_launch(*, case, now) -> None:
    """R-ALLOC-1: a case launch whose project has no core-hours left is refused (409) with what
    is left; cases already running finish and are charged in full (they may overdraw)."""
    allocation = selectors.default_for(case.owner_id, case.resource_class.pool_id, now)
    if allocation is None or allocation.core_hours is None:
        return
    left = allocation.remaining_at(now)[1]
    if left <= 0:
        raise Conflict(
            f"The allocation {allocation.name!r} has no core-hours left this period.",
            allocation=allocation.pk,
            allocation_remaining=selectors.remaining(allocation, now),
        )


# -- charging -----------------------------------------------------------------------------------
def charge_job(*, job, seconds: float, now) -> bool:
    """Charge ``job`` its device time (``seconds``) once, to its session's allocation (if any);
    call inside the transaction that records the job's end. Returns whether this call charged."""
    if not seconds or seconds <= 0:
        return False
    allocation = Allocation.objects.filter(sessions__id=job.session_id).first()
    charge = Charge(
        kind=ChargeKind.JOB,
        allocation=allocation,
        pool_id=job.pool_id,
        user_id=job.user_id,
        job_id=job.pk,
        device_seconds=seconds,
        charged_at=now,
    )
    return bool(_record([charge], {allocation.pk: allocation} if allocation else {}, now))


def charge_cases(*, cases, now) -> int:
    """Charge each ended case ``cores × execution time`` once (a case with no core count is
    counted as one core), to its owner's default allocation on its pool; call inside the
    transaction that records the cases. A constant number of statements per pass: the
    candidate allocations, the owners' groups, one INSERT, one UPDATE per allocation charged."""
    cases = [case for case in cases if case.execution_time and case.execution_time > 0]
    if not cases:
        return 0
    pool_ids = {case.resource_class.pool_id for case in cases}
    owners = {case.owner_id for case in cases}
    from django.contrib.auth import get_user_model

    members = get_user_model().groups.through.objects.filter(user_id__in=owners).values_list("user_id", "group_id")
    groups_of: dict[int, set] = {}
    for user_id, group_id in members:
        groups_of.setdefault(user_id, set()).add(group_id)
    candidates = list(Allocation.objects.filter(pool_id__in=pool_ids))
    charges, allocations = [], {}
    for case in cases:
        pool_id = case.resource_class.pool_id
        mine = [
            a
            for a in candidates
            if a.pool_id == pool_id and (a.user_id == case.owner_id or a.group_id in groups_of.get(case.owner_id, ()))
        ]
        allocation = selectors.preferred(mine, now)
        if allocation is not None:
            allocations[allocation.pk] = allocation
        charges.append(
            Charge(
                kind=ChargeKind.CASE,
                allocation=allocation,
                pool_id=pool_id,
                user_id=case.owner_id,
                case_id=case.pk,
                core_hours=(case.cores or 1) * case.execution_time / 3600.0,
                charged_at=now,
            )
        )
    return _record(charges, allocations, now)


def _record(charges: list[Charge], allocations: dict[int, Allocation], now) -> int:
    """Insert ``charges`` (those already in the ledger are skipped by the unique constraints)
    and add what was inserted to each allocation's spending of its current period::

        INSERT INTO charge (...) VALUES (...), ... ON CONFLICT DO NOTHING RETURNING allocation_id,
               device_seconds, core_hours
        UPDATE allocation SET used_x = CASE WHEN used_period_start = period THEN used_x + x   -- same period
                                            WHEN used_period_start > period THEN used_x      -- a late charge
                                            ELSE x END,                                      -- a new period
                              used_period_start = max(used_period_start, period)
         WHERE id = allocation

    The UPDATE is computed on the row as it is once locked (PostgreSQL re-reads a row another
    transaction changed meanwhile), so concurrent charges add up exactly."""
    for charge in charges:
        allocation = allocations.get(charge.allocation_id)
        period = allocation.period_at(now) if allocation else None
        charge.period_start = period[0] if period else None
    if not charges:
        return 0
    columns = values = None
    rows = []
    for charge in charges:
        columns, values = insert_values(charge)
        rows.append(values)
    marks = "(" + ", ".join(["%s"] * len(rows[0])) + ")"
    params = [value for row in rows for value in row]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Charge._meta.db_table} ({columns}) VALUES {', '.join([marks] * len(rows))}"  # noqa: S608 (names from _meta)
            " ON CONFLICT DO NOTHING RETURNING allocation_id, device_seconds, core_hours",
            params,
        )
        inserted = cursor.fetchall()
        spent: dict[int, list[float]] = {}
        for allocation_id, device, cores in inserted:
            if allocation_id is not None:
                total = spent.setdefault(allocation_id, [0.0, 0.0])
                total[0] += device
                total[1] += cores
        # In id order: two passes charging the same allocations lock their rows in one order.
        for allocation_id in sorted(spent):
            device, cores = spent[allocation_id]
            _spend(allocations[allocation_id], device, cores, now)
    return len(inserted)


def _spend(allocation: Allocation, device: float, cores: float, now) -> None:
    period = allocation.period_at(now)
    if period is None:
        return  # charged outside the grant's dates: in the ledger, not in a period's spending
    start = period[0]

    def added(field: str, amount: float):
        return Case(
            When(used_period_start=start, then=F(field) + amount),
            When(used_period_start__gt=start, then=F(field)),
            default=Value(amount),
        )

    Allocation.objects.filter(pk=allocation.pk).update(
        used_device_seconds=added("used_device_seconds", device),
        used_core_hours=added("used_core_hours", cores),
        used_period_start=Case(When(used_period_start__gt=start, then=F("used_period_start")), default=Value(start)),
    )
    # Our UPDATE holds the row's lock: this reads the figures it left.
    row = Allocation.objects.values_list("used_device_seconds", "used_core_hours", "used_period_start").get(
        pk=allocation.pk
    )
    if row[2] != start:
        return
    for resource, granted, used, amount in (
        ("device_seconds", allocation.device_seconds, row[0], device),
        ("core_hours", allocation.core_hours, row[1], cores),
    ):
        if granted is None or granted == INFINITY or amount <= 0:
            continue
        before = used - amount
        for threshold in THRESHOLDS:
            line = granted * threshold / 100.0
            if before < line <= used:
                _announce(allocation, threshold, resource, used, granted, start)


def _announce(allocation: Allocation, threshold: int, resource: str, used: float, granted: float, start) -> None:
    """Outbox rows for every member of ``allocation``'s project (its user, or its group's users),
    in the charge's transaction."""
    members = (
        [allocation.user_id]
        if allocation.user_id
        else list(get_user_model().objects.filter(groups=allocation.group_id).values_list("pk", flat=True))
    )
    what, scale, unit = UNITS[resource]
    summary = (
        f"Project {allocation.name}: {threshold} % of its {what} used this period"
        f" ({used / scale:.1f} {unit} of {granted / scale:.1f} {unit})"
    )
    payload = {
        "summary": summary,
        "allocation": {"id": allocation.pk, "name": allocation.name, "pool": allocation.pool_id},
        "resource": resource,
        "threshold": threshold,
        "used": used,
        "granted": granted,
        "period_start": start,
    }
    subject = f"allocation:{allocation.pk}:{start:%Y-%m-%dT%H:%M}:{resource}"
    notify_many((THRESHOLDS[threshold], member, subject, payload) for member in members)


# -- dates changed ------------------------------------------------------------------------------
#: the fields that say which period a moment falls in
PERIOD_FIELDS = ("starts_at", "ends_at", "period", "window_days")


def settle_period(allocation_id: int, now) -> None:
    """After an operator moved an allocation's dates (the admin), its used figures are its
    current period's charges in the ledger: moving a period never forgets what was spent in it
    (nor keeps what was spent outside it). Under the allocation's row lock, which charges take."""
    with transaction.atomic():
        allocation = Allocation.objects.select_for_update().get(pk=allocation_id)
        period = allocation.period_at(now)
        if period is None:
            return  # outside the grant nothing is left, whatever the figures say
        spent = Charge.objects.filter(
            allocation_id=allocation_id, charged_at__gte=period[0], charged_at__lt=period[1]
        ).aggregate(device=Sum("device_seconds"), cores=Sum("core_hours"))
        Allocation.objects.filter(pk=allocation_id).update(
            used_device_seconds=spent["device"] or 0.0,
            used_core_hours=spent["cores"] or 0.0,
            used_period_start=period[0],
        )
