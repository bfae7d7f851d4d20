"""Shared set-up for benchmarks: a dedicated PostgreSQL database, migrated, Django ready."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def django_on_bench_database(name: str | None = None) -> str | None:
    """Point Django at ``<server>/<name>`` (created if missing) and migrate it; the name is
    ``GRIDGATE_BENCH_DB`` (default ``gridgate_bench``), so parallel runs need not share one.

    Returns the psycopg conninfo, or None when no PostgreSQL is configured (the caller skips).
    """
    sys.path.insert(0, str(ROOT))
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return None
    import psycopg

    name = name or os.environ.get("GRIDGATE_BENCH_DB", "gridgate_bench")
    server = url.rsplit("/", 1)[0]
    with psycopg.connect(server + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = f"{server}/{name}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("GRIDGATE_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return f"{server}/{name}"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def reset_rows() -> None:
    """Empty what a bench made before it makes its rows again: charges (they keep their pool),
    jobs, sessions and the ``bench-`` pools, in batches (``apps.core.deletion``: a bench leaves
    100 000 rows and more, past what one statement may name)."""
    from apps.allocations.models import Charge
    from apps.core.deletion import delete_in_batches
    from apps.resources.models import ResourcePool
    from apps.scheduling.models import Job
    from apps.sessions.models import Session

    for rows in (Charge.objects.all(), Job.objects.all(), Session.objects.all()):
        delete_in_batches(rows)
    delete_in_batches(ResourcePool.objects.filter(name__startswith="bench-"))
