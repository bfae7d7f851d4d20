"""The user pages: access (other users' objects are 404), what each page shows, errors in words,
and constant query counts on lists."""

import io
import json
import re
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.backends.base import BackendError
from apps.backends.fake import FakeBackend
from apps.cases import passes
from apps.cases import services as case_services
from apps.cases.models import Case, CaseEvent, CaseStatus
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Job, JobStatus
from apps.sessions.models import Session, SessionStatus
from tests.cases.conftest import drive, launched

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
EXAMPLE = json.loads((Path(settings.BASE_DIR) / "examples" / "bell-like-analog.json").read_text())


def queries(client, url, **extra) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, **extra)
    assert response.status_code in (200, 286)  # 286: a finished fragment tells htmx to stop polling
    return len(ctx.captured_queries)


#: what a person must never read in a message of the pages: HTTP codes, Python exception texts,
#: parser and schema internals
TECHNICAL = (
    "(400)",
    "(403)",
    "(404)",
    "(409)",
    "(429)",
    "Traceback",
    "Expecting value",
    "Expecting property name",
    "codec can't decode",
    "is not valid under any of the given schemas",
    "Request was throttled",
    "Exception",
    "Error:",
)


def assert_user_language(page: str) -> None:
    """The messages of ``page`` (everything outside the experts' details) carry no internals."""

    visible = re.sub(r"<details class=\"detail\">.*?</details>", "", page, flags=re.S)
    for words in TECHNICAL:
        assert words not in visible, words


# -- login and home ---------------------------------------------------------------------------------
def test_anonymous_visitor_is_sent_to_the_login_page(web, local_pool):
    response = web(None).get("/")
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("web:login"))


def test_login_with_a_password_leads_home(web, owner, local_pool):
    client = web(None)
    response = client.post(reverse("web:login"), {"username": "owner", "password": "pw"})
    assert response.status_code == 302 and response["Location"] == reverse("web:home")
    assert b"Pools you can use" in client.get("/").content


def test_home_shows_usable_pools_with_classes_gauge_and_accessibility(
    web, owner, outsider, member, private_pool, qpu_pool, fake_device, open_session
):
    qpu_pool.is_accessible = False
    qpu_pool.accessibility_message = "Calibration until 14:00"
    qpu_pool.save()
    open_session(qpu_pool, owner)
    page = web(owner).get("/").content.decode()
    assert "emulators" in page and "access" in page
    assert "1 of 2" in page  # slots used of total
    assert "not accessible — Calibration until 14:00" in page
    assert "qpu-access" not in page  # the private pool's class: not granted to owner
    assert "qpu-access" in web(member).get("/").content.decode()
    assert "Edit in admin" not in page


def test_home_shows_quota_used(web, owner):
    pool = ResourcePool.objects.create(
        name="quota", kind="local", public=True, quota_cpu=4, quota_memory=8, quota_gpu=0
    )
    klass = ResourceClass.objects.create(pool=pool, name="c1", cpu=1, memory=2, default=True)
    from apps.sessions.services import admit

    admit(user=owner, resource_class=klass, slots=1)
    page = web(owner).get("/").content.decode()
    assert "1 of 4" in page and "2 of 8" in page


def test_staff_get_admin_links(web, staff, qpu_pool):
    page = web(staff).get("/").content.decode()
    assert reverse("admin:resources_resourcepool_change", args=[qpu_pool.pk]) in page
    assert reverse("admin:index") in page


def test_home_query_count_does_not_grow_with_pools(web, owner, qpu_pool):
    client = web(owner)
    client.get("/")  # warm caches (content types, session)
    few = queries(client, "/")
    for i in range(4):
        pool = ResourcePool.objects.create(name=f"p{i}", kind="local", public=True, slots_total=3)
        ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    assert queries(client, "/") == few


# -- sessions -------------------------------------------------------------------------------------
def test_open_session_from_a_class_shows_its_launch_specification(web, owner, qpu_pool):
    klass = qpu_pool.classes.get()
    response = web(owner).post(
        reverse("web:session-open"), {"resource_class": klass.pk, "slots": 2, "external_id": "slurm-1"}, follow=True
    )
    session = Session.objects.get(user=owner)
    assert session.slots == 2 and session.external_id == "slurm-1"
    page = response.content.decode()
    assert "Launch specification" in page and "Session opened" in page
    assert "cpu" in page and "memory" in page


def test_session_without_capacity_is_refused_in_words(web, owner, member, qpu_pool, open_session):
    open_session(qpu_pool, member, slots=2)
    response = web(owner).post(
        reverse("web:session-open"), {"resource_class": qpu_pool.classes.get().pk, "slots": 1}, follow=True
    )
    page = response.content.decode()
    assert response.status_code == 409
    assert "no room for that many slots right now (0 free)" in page
    assert "0 of 2 slots available" in page  # the service's exact words, for experts
    assert_user_language(page)
    assert not Session.objects.filter(user=owner).exists()


def test_class_of_a_pool_you_cannot_use_is_not_opened(web, owner, private_pool):
    response = web(owner).post(
        reverse("web:session-open"), {"resource_class": private_pool.classes.get().pk, "slots": 1}, follow=True
    )
    assert "that class is not one you can use" in response.content.decode()
    assert not Session.objects.exists()


def test_release_frees_the_session(web, owner, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)
    response = web(owner).post(reverse("web:session-release", args=[session.pk]), follow=True)
    session.refresh_from_db()
    assert session.status == SessionStatus.REVOKED and session.revocation_reason == "released"
    assert "Session released" in response.content.decode()


def test_other_users_sessions_are_404(web, owner, outsider, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)
    client = web(outsider)
    assert client.get(reverse("web:session-detail", args=[session.pk])).status_code == 404
    assert client.post(reverse("web:session-release", args=[session.pk])).status_code == 404
    assert client.post(reverse("web:job-submit", args=[session.pk]), {"example": "bell-like-analog"}).status_code == 404
    session.refresh_from_db()
    assert session.is_active
    assert str(session.pk)[:8] not in client.get(reverse("web:session-list")).content.decode()


def test_staff_see_every_session_with_an_admin_link(web, owner, staff, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)
    assert str(session.pk)[:8] in web(staff).get(reverse("web:session-list")).content.decode()
    page = web(staff).get(reverse("web:session-detail", args=[session.pk])).content.decode()
    assert reverse("admin:compute_sessions_session_change", args=[session.pk]) in page


def test_session_list_query_count_is_constant(web, owner, qpu_pool, open_session):
    qpu_pool.slots_total = None
    qpu_pool.save()
    client = web(owner)
    open_session(qpu_pool, owner)
    client.get(reverse("web:session-list"))
    few = queries(client, reverse("web:session-list"))
    for _ in range(5):
        open_session(qpu_pool, owner)
    assert queries(client, reverse("web:session-list")) == few


# -- jobs -----------------------------------------------------------------------------------------
def test_submit_a_bundled_example_and_see_its_counts_as_a_chart(
    web, settings, owner, qpu_pool, fake_device, open_session
):
    settings.GRIDGATE_TASKS_EAGER = True  # the worker's dispatch and polls run inline
    fake_device.config = {"script": ["completed"], "result": {"counts": {"00": 70, "11": 30}}}
    fake_device.save()
    session = open_session(qpu_pool, owner)
    client = web(owner)
    response = client.post(
        reverse("web:job-submit", args=[session.pk]), {"example": "bell-like-analog", "shots": 100}, follow=True
    )
    assert "submitted with 100 shots" in response.content.decode()
    job = Job.objects.get(session=session)
    assert job.payload == EXAMPLE["payload"]
    from apps.scheduling.passes import run_pool

    for _ in range(5):  # the worker's passes: poll until the scripted device reports completion
        run_pool(qpu_pool.pk)
        job.refresh_from_db()
        if job.is_finished:
            break
    assert job.status == JobStatus.COMPLETED, job.error
    page = client.get(reverse("web:job-detail", args=[job.pk])).content.decode()
    assert "<svg" in page and "Counts over 100 shots" in page
    assert "<title>00: 70</title>" in page and "<title>11: 30</title>" in page
    assert 'hx-trigger="every 2s"' not in page  # finished: the fragment stops polling


def test_uploaded_sequence_file_is_submitted(web, owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    upload = SimpleUploadedFile("seq.json", json.dumps(EXAMPLE["payload"]).encode(), content_type="application/json")
    web(owner).post(reverse("web:job-submit", args=[session.pk]), {"sequence_file": upload, "shots": 7})
    job = Job.objects.get(session=session)
    assert job.shots == 7 and job.payload == EXAMPLE["payload"]


def test_unreadable_upload_is_refused_in_words(web, owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    upload = SimpleUploadedFile("seq.json", b"{not json", content_type="application/json")
    response = web(owner).post(
        reverse("web:job-submit", args=[session.pk]), {"sequence_file": upload, "shots": 7}, follow=True
    )
    page = response.content.decode()
    assert "The job was not submitted: The file is not valid JSON" in page
    assert_user_language(page.split("Details for experts")[0])  # the parser's words only under details
    assert "Expecting property name" in page.split("Details for experts")[1]
    assert not Job.objects.exists()


def test_job_in_a_released_session_is_refused_with_403_in_words(web, owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    from apps.sessions.services import release

    release(user=session.user, session_id=session.pk)
    response = web(owner).post(
        reverse("web:job-submit", args=[session.pk]), {"example": "bell-like-analog", "shots": 5}, follow=True
    )
    page = response.content.decode()
    assert "this session has ended (released by you)" in page
    assert_user_language(page)
    assert not Job.objects.exists()


def _submit(session, n=1):
    from apps.scheduling.models import Device
    from apps.scheduling.services import submit_job

    # R-DEV-1 refuses jobs on a pool without any device: an offline one lets them wait.
    Device.objects.get_or_create(pool=session.pool, name="parked", defaults={"driver": "fake", "online": False})
    return [
        submit_job(user=session.user, session_id=session.pk, payload=EXAMPLE["payload"], shots=10) for _ in range(n)
    ]


def test_job_list_shows_pending_reason_and_position_and_keeps_polling(web, owner, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)  # no device online: jobs wait
    _submit(session, 2)
    page = web(owner).get(reverse("web:job-list"), **HX).content.decode()
    assert "<html" not in page  # htmx gets the table alone
    assert "no device online" in page
    assert 'hx-trigger="every 2s"' in page
    assert "<td>2</td>" in page  # second in the queue


def test_job_list_of_a_malformed_session_id_is_404(web, owner):
    assert web(owner).get(reverse("web:job-list") + "?session=nope", **HX).status_code == 404


def test_finished_job_list_stops_polling(web, owner, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)
    for job in _submit(session, 1):
        Job.objects.filter(pk=job.pk).update(status=JobStatus.CANCELLED)
    page = web(owner).get(reverse("web:job-list"), **HX).content.decode()
    assert "hx-trigger" not in page


def test_job_list_query_count_is_constant(web, owner, member, qpu_pool, fake_device, open_session):
    qpu_pool.slots_total = None
    qpu_pool.save()
    client = web(owner)
    _submit(open_session(qpu_pool, owner))
    client.get(reverse("web:job-list"))
    few = queries(client, reverse("web:job-list"))
    _submit(open_session(qpu_pool, owner), 3)
    _submit(open_session(qpu_pool, owner), 2)
    client.get(reverse("web:job-list"))  # the pool's queue changed: its position snapshot is rebuilt once
    assert queries(client, reverse("web:job-list")) == few
    assert queries(client, reverse("web:job-list"), **HX) <= few


def test_cancel_pending_job(web, owner, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)
    (job,) = _submit(session)
    response = web(owner).post(reverse("web:job-cancel", args=[job.pk]), {"next": "https://evil.example/"})
    assert response["Location"] == reverse("web:job-detail", args=[job.pk])  # no open redirect
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    again = web(owner).post(reverse("web:job-cancel", args=[job.pk]), follow=True)
    page = again.content.decode()
    assert f"Cancelling job {job.pk} is not possible in its current state" in page
    assert_user_language(page)


def test_other_users_jobs_are_404(web, owner, outsider, qpu_pool, open_session):
    (job,) = _submit(open_session(qpu_pool, owner))
    client = web(outsider)
    assert client.get(reverse("web:job-detail", args=[job.pk])).status_code == 404
    assert client.post(reverse("web:job-cancel", args=[job.pk])).status_code == 404
    assert f"Job {job.pk}<" not in client.get(reverse("web:job-list")).content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


# -- cases ----------------------------------------------------------------------------------------
def _case(owner, local_pool, **kwargs):
    kwargs.setdefault("name", "cavity")
    kwargs.setdefault("command", "run-solver")
    return case_services.create_case(owner=owner, resource_class=local_pool.classes.get(), **kwargs)


def test_create_case_with_input_files(web, cases_root, owner, local_pool):
    files = [io.BytesIO(b"mesh"), io.BytesIO(b"params")]
    files[0].name, files[1].name = "mesh.txt", "params.json"
    response = web(owner).post(
        reverse("web:case-list"),
        {
            "name": "wing",
            "resource_class": local_pool.classes.get().pk,
            "command": "solve mesh.txt",
            "observability_globs": "logs/*.txt, residuals.csv",
            "inputs": files,
        },
        follow=True,
    )
    case = Case.objects.get(owner=owner)
    assert case.name == "wing" and case.observability_globs == ["logs/*.txt", "residuals.csv"]
    assert reverse("web:case-files", args=[case.pk]) in response.content.decode()  # loaded by the page
    files = web(owner).get(reverse("web:case-files", args=[case.pk]), **HX).content.decode()
    assert "inputs/mesh.txt" in files and "inputs/params.json" in files
    assert reverse("case-file", kwargs={"pk": case.pk, "path": "inputs/mesh.txt"}) in files


def test_invalid_case_form_is_shown_with_its_errors(web, cases_root, owner, local_pool):
    response = web(owner).post(reverse("web:case-list"), {"name": "x", "command": "  "})
    assert response.status_code == 400
    assert "This field is required" in response.content.decode()
    assert not Case.objects.exists()


def test_case_list_query_count_is_constant(web, cases_root, owner, local_pool):
    client = web(owner)
    _case(owner, local_pool)
    client.get(reverse("web:case-list"))
    few = queries(client, reverse("web:case-list"))
    for i in range(4):
        _case(owner, local_pool, name=f"c{i}")
    assert queries(client, reverse("web:case-list")) == few


def test_other_users_cases_are_404(web, cases_root, owner, outsider, local_pool):
    case = _case(owner, local_pool)
    client = web(outsider)
    for name in ("web:case-detail", "web:case-launch"):
        assert client.get(reverse(name, args=[case.pk])).status_code == 404
    for name in ("web:case-launch", "web:case-cancel", "web:case-refresh"):
        assert client.post(reverse(name, args=[case.pk])).status_code == 404
    assert "cavity" not in client.get(reverse("web:case-list")).content.decode()
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED


def test_staff_see_every_case_with_an_admin_link(web, cases_root, owner, staff, local_pool):
    case = _case(owner, local_pool)
    assert "cavity" in web(staff).get(reverse("web:case-list")).content.decode()
    page = web(staff).get(reverse("web:case-detail", args=[case.pk])).content.decode()
    assert reverse("admin:cases_case_change", args=[case.pk]) in page


def test_a_case_page_shows_its_newest_events_and_says_how_many_there_are(web, cases_root, owner, local_pool):
    """A long-running case's notes pile up: the page showed its first 200 events, never what just
    happened."""
    case = _case(owner, local_pool)
    start = timezone.now()
    CaseEvent.objects.bulk_create(
        CaseEvent(case=case, at=start + timedelta(seconds=i), kind="note", message=f"note {i:03d}") for i in range(250)
    )
    page = web(owner).get(reverse("web:case-detail", args=[case.pk])).content.decode()
    assert "note 249" in page and "note 050" in page and "note 049" not in page
    assert page.index("note 050") < page.index("note 249")
    assert "The last 200 events; older ones are in the API" in page


def test_case_page_never_asks_the_provider(web, cases_root, owner, local_pool, monkeypatch):
    case = _case(owner, local_pool)
    launched(case)

    def boom(*args, **kwargs):
        raise AssertionError("a provider was called while rendering")

    for verb in ("poll", "poll_many", "sync", "fetch_final", "launch_options", "find", "submit"):
        monkeypatch.setattr(FakeBackend, verb, boom)
    client = web(owner)
    assert client.get(reverse("web:case-detail", args=[case.pk])).status_code == 200
    assert client.get(reverse("web:case-detail", args=[case.pk]), **HX).status_code == 200
    assert client.get(reverse("web:case-list")).status_code == 200


def test_launch_dialog_renders_the_declared_options_and_the_submission(web, cases_root, owner, local_pool):
    case = _case(owner, local_pool)
    page = web(owner).get(reverse("web:case-launch", args=[case.pk]), **HX).content.decode()
    # Whatever the backend declared (here the fake backend's one option), rendered generically.
    assert "Scripted outcome" in page and 'name="launch_option:outcome"' in page
    assert "What will be submitted" in page and "run-solver" in page
    assert ">Succeed</output>" in page  # the default, before the button is pressed
    assert 'id="launch-submit"' in page


def test_launch_dialog_opens_degraded_when_the_provider_is_unreachable(web, cases_root, owner, local_pool, monkeypatch):
    def unreachable(self, pool, identity=None):
        raise BackendError("connection refused")

    monkeypatch.setattr(FakeBackend, "launch_options", unreachable)
    case = _case(owner, local_pool)
    response = web(owner).get(reverse("web:case-launch", args=[case.pk]), **HX)
    page = response.content.decode()
    assert response.status_code == 200
    assert "could not be listed" in page and "connection refused" in page.split("Details for experts")[1]
    assert 'id="launch-submit"' in page  # the defaults still launch


def test_templates_name_no_provider_and_no_option_key():
    """Options are rendered from what the backend declared: no template knows a provider or a key."""
    text = "".join(p.read_text() for p in (Path(settings.BASE_DIR) / "templates" / "web").glob("*.html")).lower()
    for provider in ("slurm", "qarnot", "firecrest", "runai", "run:ai"):
        assert provider not in text, provider
    for key in ("outcome", "partition", "time", "account"):
        for spelling in (f"'{key}'", f'"{key}"', f".{key}", f"{key}="):
            assert spelling not in text, spelling


def test_r_back_6_a_launch_with_an_option_outside_the_allow_list_says_why_and_launches_nothing(
    web, cases_root, owner, local_pool
):
    case = _case(owner, local_pool)
    response = web(owner).post(
        reverse("web:case-launch", args=[case.pk]),
        {"launch_option:outcome": "explode", "launch_option:partition": "gpu-premium"},
        follow=True,
    )
    page = response.content.decode()
    assert "The launch was refused" in page and "one of succeed, fail" in page and "partition" in page
    assert_user_language(page)
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None


def test_launch_with_a_chosen_option_then_the_case_reaches_done(web, cases_root, owner, local_pool):
    case = _case(owner, local_pool)
    client = web(owner)
    response = client.post(
        reverse("web:case-launch", args=[case.pk]), {"launch_option:outcome": "succeed"}, follow=True
    )
    case.refresh_from_db()
    assert case.is_submitting and case.launch_options == {"outcome": "succeed"}
    assert "Launch requested" in response.content.decode()
    assert 'hx-trigger="every 2s"' in client.get(reverse("web:case-detail", args=[case.pk]), **HX).content.decode()
    passes.submit_pass(case_ids=[case.id])  # the worker's half (R-CASE-1)
    drive(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.DONE
    fragment = client.get(reverse("web:case-detail", args=[case.pk]), **HX).content.decode()
    assert "hx-trigger" not in fragment and "results fetched" in fragment
    assert "launch requested" in fragment  # the event history
    again = client.post(reverse("web:case-launch", args=[case.pk]), follow=True)
    page = again.content.decode()
    assert "The launch is not possible in its current state" in page
    assert_user_language(page)


def test_cancel_a_prepared_case(web, cases_root, owner, local_pool):
    case = _case(owner, local_pool)
    response = web(owner).post(reverse("web:case-cancel", args=[case.pk]), follow=True)
    case.refresh_from_db()
    assert case.status == CaseStatus.CANCELLED and "Case cancelled" in response.content.decode()


def test_staff_cannot_launch_another_users_case_from_the_page(web, cases_root, owner, staff, local_pool):
    """SPEC §7: launch is the owner's alone; staff see the case but get 403."""
    case = _case(owner, local_pool)
    client = web(staff)
    assert client.get(reverse("web:case-launch", args=[case.pk])).status_code == 403
    assert client.post(reverse("web:case-launch", args=[case.pk])).status_code == 403
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None


def test_refresh_is_throttled_in_words(web, settings, cases_root, owner, local_pool):
    settings.GRIDGATE_CASE_REFRESH_SECONDS = 60
    case = _case(owner, local_pool)
    launched(case)
    client = web(owner)
    assert "Refresh requested" in client.post(reverse("web:case-refresh", args=[case.pk]), follow=True).content.decode()
    page = client.post(reverse("web:case-refresh", args=[case.pk]), follow=True).content.decode()
    assert "You asked for this a moment ago. Try again in " in page
    assert_user_language(page)


def test_launch_dialog_asks_once_while_healthy_and_again_after_a_degraded_answer(
    web, cases_root, owner, local_pool, monkeypatch
):
    """R-BACK-2 through the page: the API's caching rules (healthy cached, degraded not)."""
    calls = []
    original = FakeBackend.launch_options

    def counted(self, pool, identity=None):
        calls.append(pool.pk)
        if len(calls) == 1:
            raise BackendError("timeout")
        return original(self, pool, identity)

    monkeypatch.setattr(FakeBackend, "launch_options", counted)
    case = _case(owner, local_pool)
    client = web(owner)
    url = reverse("web:case-launch", args=[case.pk])
    assert "could not be listed" in client.get(url, **HX).content.decode()
    for _ in range(2):
        assert "Scripted outcome" in client.get(url, **HX).content.decode()
    assert len(calls) == 2  # the degraded answer was not cached; the healthy one was


def test_case_page_shows_submitting_with_progress_until_the_worker_submits(web, cases_root, owner, local_pool):
    """R-CASE-1: between the launch (202) and the worker's submission the page says so."""
    case = _case(owner, local_pool)
    case_services.launch_case(case)
    client = web(owner)
    page = client.get(reverse("web:case-detail", args=[case.pk])).content.decode()
    assert 'id="case-status">Submitting<' in page and 'id="case-submitting"' in page
    assert 'id="launch-button"' not in page  # not launchable twice
    passes.submit_pass(case_ids=[case.id])
    page = client.get(reverse("web:case-detail", args=[case.pk])).content.decode()
    assert 'id="case-submitting"' not in page and 'id="case-status">Pending<' in page


def test_case_page_shows_the_providers_note_on_a_waiting_case(web, cases_root, owner, local_pool):
    case = launched(_case(owner, local_pool))
    Case.objects.filter(pk=case.pk).update(status_message="Slurm: JobHeldAdmin")
    page = web(owner).get(reverse("web:case-detail", args=[case.pk])).content.decode()
    assert "The provider says: Slurm: JobHeldAdmin" in page
    assert "Slurm: JobHeldAdmin" in web(owner).get(reverse("web:case-list")).content.decode()


# -- bad input in forms --------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["slots", "resource_class"])
def test_session_form_number_beyond_the_database_range_is_refused_in_words(web, owner, qpu_pool, field):
    data = {"resource_class": qpu_pool.classes.get().pk, "slots": 1, field: "99999999999999999999"}
    response = web(owner).post(reverse("web:session-open"), data, follow=True)
    assert response.status_code == 400
    assert "The session was not opened" in response.content.decode()
    assert not Session.objects.exists()


def test_deeply_nested_sequence_file_is_refused_in_words(web, owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    upload = SimpleUploadedFile("seq.json", b"[" * 5000 + b"]" * 5000, content_type="application/json")
    response = web(owner).post(
        reverse("web:job-submit", args=[session.pk]), {"sequence_file": upload, "shots": 7}, follow=True
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "The file is not valid JSON" in page and "nested deeper than" in page.split("Details for experts")[1]
    assert not Job.objects.exists()


# -- times ----------------------------------------------------------------------------------------
class _Tables(HTMLParser):
    """Each table of a page as its header cells and its rows' cells, as text."""

    def __init__(self):
        super().__init__()
        self.tables, self.cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append(([], []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("th", "td") and self.tables:
            self.cell = [tag, ""]

    def handle_data(self, data):
        if self.cell is not None:
            self.cell[1] += data

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self.cell is not None:
            headers, rows = self.tables[-1]
            (headers if self.cell[0] == "th" else rows[-1]).append(self.cell[1])
            self.cell = None


def test_every_time_in_a_table_says_it_is_utc(web, cases_root, owner, qpu_pool, local_pool, open_session):
    """Tables show times in UTC (settings.TIME_ZONE); a user elsewhere reads which zone in the
    column's header or the cell."""
    from apps.accounts.services import issue_token

    session = open_session(qpu_pool, owner)
    _submit(session, 1)
    _case(owner, local_pool)
    issue_token(owner, name="laptop")
    moment = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}")
    checked = 0
    for name in ("web:session-list", "web:job-list", "web:case-list", "web:token-list"):
        parser = _Tables()
        parser.feed(web(owner).get(reverse(name)).content.decode())
        for headers, rows in parser.tables:
            for row in rows:
                for header, cell in zip(headers, row, strict=False):
                    if moment.search(cell):
                        checked += 1
                        assert "UTC" in header or "UTC" in cell, (name, header, cell)
    assert checked >= 6
