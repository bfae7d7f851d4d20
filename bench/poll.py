"""Poll-pass benchmark (SPEC §9): 100 and 1 000 running cases on the fake backend.

Prints, for each size: SQL queries per pass (must not grow with the number of cases), backend
status calls per case per pass (≤ 1) and pass time per case, with ratios against the 100-case
baseline measured in the same run. Runs in a throwaway database (created and dropped here) and a
temporary cases root, so it never touches real data.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

SIZES = (100, 1000)


def populate(n, owner, resource_class):
    from apps.backends.fake import FakeBackend, FakeJob
    from apps.cases import workspace
    from apps.cases.models import Case, CaseStatus

    past = timezone.now() - timezone.timedelta(seconds=1)
    cases = []
    for i in range(n):
        case = Case(
            owner=owner,
            resource_class=resource_class,
            name=f"bench-{i}",
            command="solve",
            status=CaseStatus.RUNNING,
            backend="fake",
            remote_id=f"bench-{n}-{i}",
            submitted_at=past,
            started_at=past,
            next_poll_at=past,
            next_sync_at=past + timezone.timedelta(hours=1),
        )
        # The fake provider keeps every job running, so each pass does the same work.
        FakeBackend.jobs[case.remote_id] = FakeJob(case_id=str(case.id), script=["running"], step=0)
        workspace.create_case_dir(case.id)
        cases.append(case)
    Case.objects.bulk_create(cases)


def measure(n, owner, resource_class):
    from apps.backends.fake import FakeBackend
    from apps.cases import passes
    from apps.cases.models import Case

    Case.objects.all().delete()
    FakeBackend.reset()
    populate(n, owner, resource_class)
    FakeBackend.calls = {}
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        report = passes.poll_pass(batch=n)
        elapsed = time.perf_counter() - started
    assert report.recorded == n, report
    return {
        "n": n,
        "queries": len(queries.captured_queries),
        "calls_per_case": FakeBackend.calls.get("poll", 0) / n,
        "ms_per_case": elapsed * 1000 / n,
        "pass_s": elapsed,
    }


def main() -> int:
    from django.contrib.auth import get_user_model

    from apps.resources.models import ResourceClass, ResourcePool

    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})["NAME"] = f"bench_poll_{os.getpid()}"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    tmp = tempfile.TemporaryDirectory(prefix="gridgate-bench-")
    settings.GRIDGATE_CASES_ROOT = Path(tmp.name)
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake"}
    try:
        owner = get_user_model().objects.create_user("bench")
        pool = ResourcePool.objects.create(name="bench", kind="local", public=True)
        resource_class = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
        measure(20, owner, resource_class)  # warm-up: imports, connection, plan caches
        rows = [measure(n, owner, resource_class) for n in SIZES]
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        tmp.cleanup()
    base = rows[0]
    print(f"poll pass on the fake backend ({connection.vendor})")
    print(f"{'cases':>6} {'queries/pass':>13} {'status calls/case':>18} {'ms/case':>8} {'pass s':>7}")
    for row in rows:
        print(
            f"{row['n']:>6} {row['queries']:>13} {row['calls_per_case']:>18.2f} "
            f"{row['ms_per_case']:>8.3f} {row['pass_s']:>7.3f}"
        )
    big = rows[-1]
    print(
        f"ratio {big['n']}/{base['n']} cases: queries x{big['queries'] / base['queries']:.2f}, "
        f"time per case x{big['ms_per_case'] / base['ms_per_case']:.2f}"
    )
    ok = big["queries"] == base["queries"] and all(row["calls_per_case"] <= 1 for row in rows)
    print("PASS: queries per pass constant, at most one status call per case" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
