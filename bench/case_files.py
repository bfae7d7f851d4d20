"""A running case's page with a huge workspace: 10 files against 50 000.

The case page's live fragment is asked for every 2 s while the case runs, by every open tab. It
once listed the whole workspace (a walk, a stat and a sort of every file, then a link for each),
so a 50 000-file case cost seconds per poll. Measured here through the full Django stack (test
client, session login), median of ``BENCH_CASE_REQUESTS`` requests each: the full page, the 2 s
fragment, the files fragment (first and last page of 200) and ``GET /api/v1/cases/{id}/files/``
(first page of 500), each against the same view on a 10-file workspace. A view the checkout does
not have (an older version without the files fragment) is reported as absent.
``BENCH_CASE_FILES`` (default 50 000).
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database  # noqa: E402

FILES = int(os.environ.get("BENCH_CASE_FILES", "50000"))
REQUESTS = int(os.environ.get("BENCH_CASE_REQUESTS", "5"))
SMALL = 10


def make_case(owner, klass, files: int):
    from apps.cases import services, workspace
    from apps.cases.models import Case, CaseStatus

    case = services.create_case(owner=owner, resource_class=klass, name=f"bench-{files}", command="solve")
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.RUNNING, backend="fake", remote_id="bench")
    root = workspace.case_dir(case.id)
    # As a solver leaves them: many directories of many small files, in results/ and live/.
    made = set()
    for i in range(files):
        directory = root / ("results" if i % 4 else "live") / f"step{i // 1000:03d}"
        if directory not in made:
            directory.mkdir(parents=True, exist_ok=True)
            made.add(directory)
        (directory / f"field_{i:06d}.vtu").write_bytes(b"x" * (i % 7))
    return case


def timed(client, url, **extra) -> float | None:
    times = []
    for _ in range(REQUESTS):
        start = time.perf_counter()
        response = client.get(url, **extra)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        times.append(time.perf_counter() - start)
        if response.status_code == 404:
            return None
        assert response.status_code in (200, 286), (url, response.status_code, body[:300])
    return statistics.median(times)


def views(case, files: int) -> dict[str, tuple[str, dict]]:
    from django.urls import NoReverseMatch, reverse

    hx = {"HTTP_HX_REQUEST": "true"}
    out = {
        "case page (full)": (reverse("web:case-detail", args=[case.pk]), {}),
        "live fragment (every 2 s)": (reverse("web:case-detail", args=[case.pk]), hx),
        "API files, page 1 of 500": (f"/api/v1/cases/{case.pk}/files/?page_size=500", {}),
    }
    try:
        files_url = reverse("web:case-files", args=[case.pk])
    except NoReverseMatch:
        return out
    last = max(1, -(-(files + 2) // 200))  # + the two logs
    out["files fragment, page 1"] = (files_url, hx)
    out[f"files fragment, page {last}"] = (f"{files_url}?page={last}", hx)
    return out


def main() -> int:
    if django_on_bench_database() is None:
        print("case_files: skipped (needs PostgreSQL)")
        return 0
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from apps.cases.models import Case
    from apps.resources.models import ResourceClass, ResourcePool

    root = Path(tempfile.mkdtemp(prefix="gridgate-bench-cases-"))
    settings.GRIDGATE_CASES_ROOT = root / "cases"
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake"}
    settings.ALLOWED_HOSTS = ["*"]
    user, _ = get_user_model().objects.get_or_create(username="bench-cases")
    Case.objects.filter(resource_class__pool__name="bench-case-files").delete()
    ResourcePool.objects.filter(name="bench-case-files").delete()
    pool = ResourcePool.objects.create(name="bench-case-files", kind="local", public=True)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    try:
        start = time.perf_counter()
        small, big = make_case(user, klass, SMALL), make_case(user, klass, FILES)
        print(f"case_files: {FILES} files written in {time.perf_counter() - start:.1f} s", flush=True)
        client = Client()
        client.force_login(user)
        small_views, big_views = views(small, SMALL), views(big, FILES)
        for name, (url, extra) in big_views.items():
            base_url, base_extra = small_views.get(name, small_views.get("files fragment, page 1", (url, extra)))
            base = timed(client, base_url, **base_extra)
            figure = timed(client, url, **extra)
            if figure is None:
                print(f"  {name:32s} absent in this version")
                continue
            print(
                f"  {name:32s} {SMALL} files {base * 1000:8.1f} ms   {FILES} files {figure * 1000:8.1f} ms"
                f"   ratio {figure / base:6.1f}",
                flush=True,
            )
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        Case.objects.filter(resource_class__pool=pool).delete()
        pool.delete()
    return 0


if __name__ == "__main__":
    sys.exit(main())
