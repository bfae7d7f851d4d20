"""A full cases disk is a clear answer (SPEC §10): an upload or a launch that cannot be stored is
a 507 JSON ``{"detail", "free_bytes"}`` that leaves nothing behind; a running case's logs note
the output they could not keep; the free space shows in health, /metrics and doctor.

The disk is real: a 1 MiB tmpfs mounted as the cases root (root only; CI runs as root), filled
by a file of the test's own."""

import errno
import io
import os
import subprocess
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from apps.cases import passes, workspace
from apps.cases.models import Case, CaseEvent, CaseStatus
from tests.cases.conftest import drive, launched

pytestmark = pytest.mark.django_db

CI = os.environ.get("CI", "").lower() == "true"


def required(reason: str):
    if CI:
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture
def small_disk(settings, tmp_path):
    """A 1 MiB tmpfs whose ``cases/`` is the cases root."""
    if os.geteuid() != 0:
        required("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0711", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        required(f"cannot mount a tmpfs: {done.stderr.strip()}")
    settings.GRIDGATE_CASES_ROOT = mount / "cases"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(mount: Path, *, leave: int = 0) -> Path:
    """Write a file until the disk is full, then give back ``leave`` bytes."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def assert_507(response):
    assert response.status_code == 507, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"detail", "free_bytes"} and isinstance(body["free_bytes"], int)
    assert "full" in body["detail"]
    return body


def case_dirs(mount: Path) -> list[str]:
    root = mount / "cases"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".worker")) if root.exists() else []


@pytest.mark.tmpfs
def test_an_upload_larger_than_the_free_space_is_507_and_leaves_nothing(api, owner, local_pool, small_disk):
    """It was a 500 (ENOSPC in save_uploads)."""
    upload = SimpleUploadedFile("mesh.dat", b"m" * (2 * 1024 * 1024))
    response = api(owner).post(
        "/api/v1/cases/",
        {"name": "c", "resource_class": local_pool.classes.get().pk, "command": "true", "inputs": [upload]},
        format="multipart",
    )
    assert_507(response)
    assert not Case.objects.exists() and case_dirs(small_disk) == []


@pytest.mark.tmpfs
def test_a_disk_that_fills_while_an_upload_is_written_is_507_and_leaves_nothing(
    api, owner, local_pool, small_disk, monkeypatch
):
    """Room at the check, none at the write (another writer filled the disk meanwhile): the real
    ENOSPC in the middle of the file is answered the same, and the half-written file is gone."""
    real = workspace._save_staged

    def another_writer_fills_the_disk_first(*args):
        fill(small_disk, leave=100 * 1024)
        return real(*args)

    monkeypatch.setattr(workspace, "_save_staged", another_writer_fills_the_disk_first)
    upload = SimpleUploadedFile("mesh.dat", b"m" * (400 * 1024))
    response = api(owner).post(
        "/api/v1/cases/",
        {"name": "c", "resource_class": local_pool.classes.get().pk, "command": "true", "inputs": [upload]},
        format="multipart",
    )
    body = assert_507(response)
    assert body["free_bytes"] < 400 * 1024
    assert not Case.objects.exists() and case_dirs(small_disk) == []


@pytest.mark.tmpfs
def test_a_launch_onto_a_cases_disk_below_its_floor_is_507_and_not_recorded(
    api, owner, make_case, small_disk, settings
):
    settings.GRIDGATE_CASES_MIN_FREE_MB = 1
    case = make_case()
    fill(small_disk, leave=100 * 1024)
    body = assert_507(api(owner).post(f"/api/v1/cases/{case.id}/launch/", {}, format="json"))
    assert "GRIDGATE_CASES_MIN_FREE_MB" in body["detail"] and body["free_bytes"] <= 100 * 1024
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None
    assert not case.events.filter(kind=CaseEvent.Kind.LAUNCH).exists()


@pytest.mark.tmpfs
def test_output_a_full_disk_kept_out_of_a_log_is_noted_in_it_once_there_is_room(make_case, small_disk, settings):
    """The poll's stdout delta (the fake backend's "step n/m") cannot be appended: the case is not
    failed, the poll does not fail, and once the disk has room the log says how many lines were
    not kept and when, before what came after. Before, the delta was lost with no note."""
    settings.GRIDGATE_CASES_MIN_FREE_MB = 0  # a 1 MiB disk: launches are not what this is about
    case = drive(launched(make_case()), max_passes=2, until=CaseStatus.RUNNING)
    stdout = workspace.case_dir(case.id) / "stdout.log"
    page = os.sysconf("SC_PAGE_SIZE")  # tmpfs takes room a page at a time: the next append needs a new one
    with stdout.open("a") as handle:
        handle.write("." * (page - 1 - stdout.stat().st_size % page) + "\n")
    before = stdout.read_text()
    filler = fill(small_disk)
    passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.log_gap["stdout"][0] == 1 and case.log_gap["stdout"][1] > 0
    assert stdout.read_text() == before  # nothing half-written
    filler.unlink()  # an operator makes room
    case = drive(case)
    text = stdout.read_text()
    assert "1 line(s)" in text and "could not be kept: the cases disk was full from" in text
    assert text.index("could not be kept") < text.rindex("step")  # the note, then what came after
    assert case.log_gap == {} and case.status == CaseStatus.DONE


def test_health_metrics_and_doctor_report_a_cases_disk_below_its_floor(client, api, settings, cases_root):
    from tests.metrics.test_metrics_values import TOKEN, scrape

    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    settings.GRIDGATE_METRICS_NETWORKS = ()
    settings.GRIDGATE_CASES_MIN_FREE_MB = 10**9  # more than any disk here has
    health = api(None).get("/api/v1/health/").json()
    assert health["status"] == "degraded" and health["cases_root"]["low"] is True
    assert health["cases_root"]["free_bytes"] < health["cases_root"]["min_free_bytes"]
    families = scrape(client)
    (free,) = families["gridgate_cases_root_free_bytes"].values()
    assert free == health["cases_root"]["free_bytes"] or abs(free - health["cases_root"]["free_bytes"]) < 2**30
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("doctor", "--backend", "fake", stdout=out)
    assert "FAIL  [site] cases root space:" in out.getvalue() and "GRIDGATE_CASES_MIN_FREE_MB" in out.getvalue()
    settings.GRIDGATE_CASES_MIN_FREE_MB = 0
    assert api(None).get("/api/v1/health/").json()["cases_root"]["low"] is False
