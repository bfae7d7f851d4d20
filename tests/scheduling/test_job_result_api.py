"""``GET /jobs/{id}/result/``: a completed job's counts as JSON or CSV, for scripts, spreadsheets
and the job page's download links; a job without a result is a 409 saying why."""

import csv
import io

import pytest
from django.test import Client
from django.utils import timezone

from apps.scheduling.models import Job, JobStatus
from apps.scheduling.services import submit_job

pytestmark = pytest.mark.django_db

COUNTS = {"11": 101, "00": 197, "10": 104, "01": 98}


@pytest.fixture
def job(owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    job = submit_job(user=owner, session_id=session.pk, payload={"x": 1}, shots=500)
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.COMPLETED, device=fake_device, result={"counts": COUNTS}, finished_at=timezone.now()
    )
    return job


def test_json_result_has_the_counts_in_bitstring_order_and_probabilities(api, owner, job):
    answer = api(owner).get(f"/api/v1/jobs/{job.pk}/result/")

    assert answer.status_code == 200
    body = answer.json()
    assert list(body["counts"].items()) == sorted(COUNTS.items())
    assert (body["job"], body["shots"], body["status"]) == (job.pk, 500, "completed")
    assert body["probabilities"]["00"] == pytest.approx(197 / 500)


def test_csv_result_is_one_row_per_bitstring(api, owner, job):
    answer = api(owner).get(f"/api/v1/jobs/{job.pk}/result/?format=csv", HTTP_ACCEPT="text/csv")

    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    assert answer["Content-Disposition"] == f'inline; filename="job-{job.pk}-result.csv"'
    rows = list(csv.reader(io.StringIO(answer.content.decode())))
    assert rows[0] == ["bitstring", "count", "probability"]
    assert [(bits, int(n)) for bits, n, _ in rows[1:]] == sorted(COUNTS.items())


def test_the_job_page_links_both_downloads(owner, job):
    client = Client()
    client.force_login(owner)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"/api/v1/jobs/{job.pk}/result/?format=csv" in page and f"/api/v1/jobs/{job.pk}/result/?format=json" in page
    assert f"gridgate job result {job.pk} --csv" in page  # the "from your script" snippet
    assert client.get(f"/api/v1/jobs/{job.pk}/result/?format=csv").status_code == 200  # the browser's session


@pytest.mark.parametrize(
    "status, words",
    [
        (JobStatus.PENDING, "it is pending; wait until it is completed"),
        (JobStatus.FAILED, "it failed: boom"),
        (JobStatus.CANCELLED, "it was cancelled"),
    ],
)
def test_a_job_without_a_result_is_409_in_json_even_when_csv_was_asked(api, owner, job, status, words):
    Job.objects.filter(pk=job.pk).update(status=status, result=None, error="boom")

    for query, accept in (("", "application/json"), ("?format=csv", "text/csv")):
        answer = api(owner).get(f"/api/v1/jobs/{job.pk}/result/{query}", HTTP_ACCEPT=accept)
        assert answer.status_code == 409
        assert answer["Content-Type"] == "application/json"
        assert answer.json() == {"detail": f"Job {job.pk} has no result: {words}.", "status": str(status)}


def test_another_users_job_result_is_404(api, member, job):
    assert api(member).get(f"/api/v1/jobs/{job.pk}/result/").status_code == 404
