"""R-ACCT-1: usage per user, group, project or pool per period, from the charge ledger (so the
export equals the charges). One aggregate query whatever the number of charges; CSV and JSON
carry the same rows."""

from datetime import UTC, datetime

from django.db.models import Count, DateTimeField, Q, Sum, Value
from django.db.models.functions import Coalesce, TruncDay, TruncMonth, TruncWeek

from apps.allocations.models import Charge, ChargeKind
from apps.core.csvfiles import write_csv

GROUP_BY = {
    # key: (what the row names, the columns it groups on)
    "user": ("user", ["user__username"]),
    "group": ("group", ["allocation__group__name"]),
    "project": ("project", ["allocation_id", "allocation__name"]),
    "pool": ("pool", ["pool__name"]),
}
PERIODS = {"month": TruncMonth, "week": TruncWeek, "day": TruncDay}
COLUMNS = ["period", "group_by", "key", "project_id", "device_seconds", "core_hours", "jobs", "cases"]


def month_bounds(value: str) -> tuple[datetime, datetime]:
    """'2026-11' → (2026-11-01, 2026-12-01) in UTC; ValueError when it is not a month."""
    year, month = (int(part) for part in value.split("-"))
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def usage(
    *, since: datetime, until: datetime, group_by: str = "user", period: str | None = "month", pool_ids=None
) -> list[dict]:
    """One row per (period, key) with charges in [since, until) (on ``pool_ids``, when given):
    device seconds, core-hours, and the jobs and cases charged; ``period`` None: one row per key
    for the whole range (the utilization page). Charges with no allocation (pools without any)
    count under an empty group and project."""
    label, columns = GROUP_BY[group_by]
    charges = Charge.objects.filter(charged_at__gte=since, charged_at__lt=until)
    if pool_ids is not None:
        charges = charges.filter(pool_id__in=pool_ids)
    if period is None:
        charges = charges.annotate(bucket=Value(None, output_field=DateTimeField()))
    else:
        charges = charges.annotate(bucket=PERIODS[period]("charged_at", tzinfo=UTC))
    rows = (
        charges.values("bucket", *columns)
        .annotate(
            device=Coalesce(Sum("device_seconds"), 0.0),
            cores=Coalesce(Sum("core_hours"), 0.0),
            jobs=Count("pk", filter=Q(kind=ChargeKind.JOB)),
            cases=Count("pk", filter=Q(kind=ChargeKind.CASE)),
        )
        .order_by("bucket", *columns)
    )
    out = []
    for row in rows:
        bucket = row["bucket"]
        out.append(
            {
                "period": _period_label(bucket, period),
                "group_by": label,
                "key": row[columns[-1]] or "",
                "project_id": row.get("allocation_id"),
                "device_seconds": round(row["device"], 6),
                "core_hours": round(row["cores"], 6),
                "jobs": row["jobs"],
                "cases": row["cases"],
            }
        )
    return out


def _period_label(bucket, period: str | None) -> str:
    if bucket is None:
        return ""
    return bucket.strftime("%Y-%m") if period == "month" else bucket.strftime("%Y-%m-%d")


def as_csv(rows: list[dict]) -> str:
    """The rows as the CSV finance opens in a spreadsheet (names that start like a formula are
    shown as text: ``apps.core.csvfiles``)."""
    return write_csv(COLUMNS, ([row[column] for column in COLUMNS] for row in rows), for_spreadsheets=True)
