"""Usage per (user, pool) over a period (SPEC §7 ``GET /accounting/``).

Everything a QRMI client does is an ordinary session and job (R-QRMI-3), so it is counted here
like the rest. Aggregation happens in the database, one grouped query per kind of usage; only
the wait-time percentile is computed in Python, over the waits of the period.
"""

import math
from collections import defaultdict
from datetime import datetime

from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least

from apps.cases.models import Case
from apps.scheduling.models import Job
from apps.sessions.models import Session


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def usage(since: datetime, until: datetime, *, pool_id: int | None = None, username: str | None = None) -> list[dict]:
    rows: dict[tuple[str, str], dict] = defaultdict(
        lambda: {
            "session_slot_hours": 0.0,
            "sessions": 0,
            "jobs": {},
            "device_seconds": 0.0,
            "wait_mean_seconds": None,
            "wait_p95_seconds": None,
            "cases": {},
            "case_execution_seconds": 0.0,
        }
    )

    sessions = Session.objects.filter(created_at__lt=until).filter(Q(revoked_at__isnull=True) | Q(revoked_at__gt=since))
    jobs = Job.objects.filter(created_at__gte=since, created_at__lt=until)
    cases = Case.objects.filter(created_at__gte=since, created_at__lt=until)
    if pool_id is not None:
        sessions, jobs = sessions.filter(pool_id=pool_id), jobs.filter(pool_id=pool_id)
        cases = cases.filter(resource_class__pool_id=pool_id)
    if username:
        sessions, jobs = sessions.filter(user__username=username), jobs.filter(user__username=username)
        cases = cases.filter(owner__username=username)

    # Slot-hours: slots × the part of each session's life inside the period.
    overlap = ExpressionWrapper(
        Least(Coalesce("revoked_at", Value(until)), Value(until)) - Greatest("created_at", Value(since)),
        output_field=DurationField(),
    )
    for row in (
        sessions.annotate(overlap=overlap)
        .values("user__username", "pool__name", "slots", "overlap")
        .iterator(chunk_size=2000)
    ):
        entry = rows[(row["user__username"], row["pool__name"])]
        entry["session_slot_hours"] += row["slots"] * max(row["overlap"].total_seconds(), 0) / 3600
        entry["sessions"] += 1

    for row in jobs.values("user__username", "pool__name", "status").annotate(n=Count("id")).order_by():
        rows[(row["user__username"], row["pool__name"])]["jobs"][row["status"]] = row["n"]
    wait = ExpressionWrapper(F("scheduled_at") - F("created_at"), output_field=DurationField())
    dispatched = jobs.filter(scheduled_at__isnull=False)
    for row in (
        jobs.values("user__username", "pool__name")
        .annotate(
            device=Coalesce(Sum("runtime_seconds"), 0.0), wait_mean=Avg(wait, filter=Q(scheduled_at__isnull=False))
        )
        .order_by()
    ):
        entry = rows[(row["user__username"], row["pool__name"])]
        entry["device_seconds"] = round(row["device"], 3)
        if row["wait_mean"] is not None:
            entry["wait_mean_seconds"] = round(row["wait_mean"].total_seconds(), 3)
    waits = defaultdict(list)
    for row in dispatched.annotate(wait=wait).values("user__username", "pool__name", "wait").iterator(chunk_size=5000):
        waits[(row["user__username"], row["pool__name"])].append(row["wait"].total_seconds())
    for key, values in waits.items():
        rows[key]["wait_p95_seconds"] = round(_p95(values), 3)

    for row in (
        cases.values("owner__username", "resource_class__pool__name", "status")
        .annotate(n=Count("id"), execution=Coalesce(Sum("execution_time"), 0.0))
        .order_by()
    ):
        entry = rows[(row["owner__username"], row["resource_class__pool__name"])]
        entry["cases"][row["status"]] = row["n"]
        entry["case_execution_seconds"] += row["execution"]

    out = []
    for (user, pool), entry in sorted(rows.items()):
        entry["session_slot_hours"] = round(entry["session_slot_hours"], 4)
        entry["case_execution_seconds"] = round(entry["case_execution_seconds"], 3)
        out.append({"user": user, "pool": pool, **entry})
    return out
