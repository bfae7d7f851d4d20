"""The Run:AI backend against the local Run:AI double, with the real runapy client over HTTP
(R-BACK-1, R-BACK-6, R-CASE-1 … 7; docs/backends.md "runai"). A temporary directory
stands for the shared volume: ``working_root`` here, ``host_path`` on the double's "nodes"."""

import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import urllib3.util.retry

from apps.backends import runai as rb
from apps.backends.base import BackendStatus
from apps.backends.runai import client as rb_client
from apps.cases import passes, workspace
from apps.cases.models import CaseStatus
from apps.core.exceptions import Invalid
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.conftest import RunaiDriver, launch, poll_once, poll_until, wait_for_terminal, wait_until

pytestmark = pytest.mark.django_db

PROVIDER = "runai"  # the ``driver`` fixture's


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(rb_client, "TIMEOUT", 3)


@pytest.fixture
def r_pool(driver):
    return driver.service_pool(name="runai", klass={"name": "a100", "cpu": "1.5"})


def test_the_workload_asks_whole_cpus_the_class_memory_and_mounts_only_its_own_directory(r_pool, make_case, double):
    volume = Path(r_pool.remote["working_root"])
    case = launch(make_case, r_pool, "true")
    spec = double.workloads[case.remote_id].body["spec"]
    assert spec["image"] == "registry.example.org/solver:1.2"
    assert (spec["command"], spec["args"], spec["workingDir"]) == ("/bin/sh", "/gridgate/job.sh", "/gridgate/work")
    compute = spec["compute"]
    assert compute["cpuCoreRequest"] == 2 and compute["cpuMemoryRequest"] == "4G" and compute["gpuDevicesRequest"] == 1
    assert "gpuPortionRequest" not in {k for k, v in compute.items() if v is not None}
    (mount,) = spec["storage"]["hostPath"]
    assert (mount["path"], mount["mountPath"], mount["readOnly"]) == (f"{volume}/{case.id}", "/gridgate", False)
    env = {item["name"]: item["value"] for item in spec["environmentVariables"]}
    assert env["GRIDGATE_CASE_ID"] == str(case.id) and env["RSC_REMOTE_KIND"] == "runai"
    assert spec["backoffLimit"] == 0 and not spec.get("nodePools")  # the project's order of node pools
    assert (volume / str(case.id)).stat().st_mode & 0o777 == 0o700
    assert not (volume / str(case.id) / "manifest.json").exists()  # the inputs' hashes stay out of the job's reach


def test_a_workload_deleted_at_runai_ends_the_case_cancelled(r_pool, make_case, double):
    """GET /workloads/{id} answers 404 for a deleted workload: it is found among the deleted ones."""
    case = launch(make_case, r_pool, "sleep 30")
    case = poll_until(case, lambda c: c.status == CaseStatus.RUNNING)
    rb.RunaiBackend().cancel(passes.job_ref(case))  # as if deleted in Run:AI's console
    wait_until(lambda: double.workloads[case.remote_id].deleted, what="deletion")
    state = rb.RunaiBackend().poll(passes.job_ref(case))
    assert state.status == BackendStatus.CANCELLED and "deleted at Run:AI" in state.message


def test_runapys_refresher_asks_a_new_token_before_exp(r_pool, make_case, double):
    """Tokens living less than runapy's 60 s margin are renewed before each call, through the
    v2 token endpoint (runapy's own v1 request is not used)."""
    double.token_lifetime = 30
    case = launch(make_case, r_pool, "true")
    before = double.token_requests
    rb.RunaiBackend().poll(passes.job_ref(case))
    assert double.token_requests > before
    assert not any(path == "/api/v1/token" for _method, path in double.calls)


def test_a_poll_answered_5xx_or_429_is_retried_but_a_retry_after_longer_than_the_cap_is_left_to_the_next_pass(
    r_pool, make_case, double, monkeypatch
):
    """A 5xx or a 429 is asked again within the poll, a ``Retry-After`` up to ``RETRY_AFTER_MAX``
    waited for; a longer one gives up at once (one request, no wait: a pass stays bounded), the
    poll counts as failed and the next pass asks again. The sleeps asked for are recorded, not slept."""
    sleeps = []
    clock = SimpleNamespace(sleep=sleeps.append, time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(urllib3.util.retry, "time", clock)  # the transport's waits
    monkeypatch.setattr(rb_client, "time", clock)  # the backend's own (the token request)
    double.hold = {"Pending"}
    case = launch(make_case, r_pool, "true")
    assert case.status == CaseStatus.PENDING, case.last_error
    path = f"/api/v1/workloads/{case.remote_id}"

    double.fault(f"{path}$", status=503, times=1, method="GET")
    double.fault(f"{path}$", status=429, times=1, method="GET", headers={"Retry-After": "2"})
    double.calls.clear()
    assert rb.RunaiBackend().poll(passes.job_ref(case)).status == BackendStatus.PENDING
    assert sleeps == [2] and double.calls.count(("GET", path)) == 3

    sleeps.clear()
    double.calls.clear()
    long_wait = str(rb_client.RETRY_AFTER_MAX * 60)
    double.fault(f"{path}$", status=429, times=rb_client.RETRIES + 1, method="GET", headers={"Retry-After": long_wait})
    poll_once(case)
    assert double.calls.count(("GET", path)) == 1  # not asked again in this pass
    assert not [seconds for seconds in sleeps if seconds >= rb_client.RETRY_AFTER_MAX]
    assert case.status == CaseStatus.PENDING and case.poll_failures == 1 and "429" in case.last_error

    double.faults.clear()  # the API is back: the next pass asks again and goes on
    double.hold = set()
    assert wait_for_terminal(case).status == CaseStatus.DONE


def test_a_create_answered_409_adopts_the_workload_of_that_name_instead_of_creating_a_second(r_pool, make_case, double):
    """The lookup by name before a create can miss the workload another attempt has just created
    (a worker racing this one, a listing not up to date yet): the create is then answered 409
    (the name is taken in the project) and the workload of that name is adopted, not failed."""
    double.hold = {"Pending"}
    case = launch(make_case, r_pool, "cat in.txt > out.txt")
    assert case.status == CaseStatus.PENDING, case.last_error
    double.calls.clear()
    adopted = rb.RunaiBackend().submit(passes.build_spec(case))  # no lookup first: straight to the create
    assert adopted == case.remote_id
    assert double.calls.count(("POST", "/api/v1/workloads/trainings")) == 1  # the one answered 409
    assert [w.id for w in double.workloads.values()] == [case.remote_id]
    double.hold = set()
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"


def test_a_4xx_refusal_fails_the_launch_with_its_status_and_runais_message_in_the_log(driver, make_case, caplog):
    """Under the service's account its users read the status and a reference (F18); Run:AI's
    words are in the log under that reference, for the operators."""
    klass = {"cpu": 1, "memory": 1, "gpu": 0}
    pool = driver.service_pool(name="wrong-pool", klass=klass, project="team-b", node_pool="a100")
    caplog.set_level(logging.WARNING)
    case = launch(make_case, pool, "true")
    assert case.status == CaseStatus.FAILED
    assert "the provider answered HTTP 400 (reference " in case.last_error
    reference = case.last_error.split("(reference ")[1].split(":")[0]
    assert f"provider answer {reference}" in caplog.text
    assert "node pool a100 is not assigned to project team-b" in caplog.text


def test_an_unknown_phase_keeps_a_running_case_running(r_pool, make_case, double):
    double.hold = {"Running"}
    case = launch(make_case, r_pool, "true")
    case = poll_until(case, lambda c: c.status == CaseStatus.RUNNING)
    double.force_phase(case.remote_id, "Quiescing")
    for _ in range(3):
        poll_once(case)
    assert case.status == CaseStatus.RUNNING and case.poll_failures == 0
    double.force_phase(case.remote_id, None)
    double.hold = set()
    assert wait_for_terminal(case).status == CaseStatus.DONE


@pytest.mark.parametrize(
    "phase,status",
    [
        ("Pending", "pending"),
        ("Creating", "pending"),
        ("Initializing", "pending"),
        ("Running", "running"),
        ("Completed", "succeeded"),
        ("Succeeded", "succeeded"),
        ("Failed", "failed"),
        ("Stopped", "cancelled"),
        ("Deleted", "cancelled"),
        ("Unknown", "pending"),
        ("SomethingNew", "pending"),
        ("", "pending"),
    ],
)
def test_every_runai_phase_maps_to_a_core_status_and_an_unknown_one_never_to_a_failure(phase, status):
    assert rb.map_phase(phase) == status


def test_a_fraction_of_a_gpu_is_sent_as_a_portion_of_each_device(driver, double, make_case):
    pool = driver.service_pool(name="frac", klass={"name": "2gpu", "cpu": 2, "memory": 8, "gpu": 2})
    case = launch(make_case, pool, "true", launch_options={"gpu_portion": "0.5"})
    assert case.status == CaseStatus.PENDING, case.last_error
    compute = double.workloads[case.remote_id].body["spec"]["compute"]
    assert [compute[key] for key in ("gpuRequestType", "gpuDevicesRequest", "gpuPortionRequest")] == ["portion", 2, 0.5]


def test_a_fraction_of_a_gpu_is_refused_for_a_class_without_gpus_and_outside_the_choices(double, make_case, r_pool):
    cpu_only = ResourceClass.objects.create(pool=r_pool, name="cpu", cpu=1, memory=1, gpu=0)
    with pytest.raises(Invalid) as refused:
        make_case(resource_class=cpu_only, launch_options={"gpu_portion": "0.5"})
    assert "gpu_portion" in refused.value.detail and "declared options: project, node_pool" in refused.value.detail
    with pytest.raises(Invalid) as outside:
        make_case(resource_class=r_pool.classes.get(name="a100"), launch_options={"gpu_portion": "1.5"})
    assert "0.25" in outside.value.detail
    assert not double.workloads


def test_results_never_follow_a_symlink_out_of_the_volume(r_pool, make_case, double):
    case = wait_for_terminal(
        launch(make_case, r_pool, "ln -s /etc/passwd leak; mkdir d; ln -s /etc d/etc; echo ok > ok")
    )
    results = workspace.case_dir(case.id) / "results"
    assert case.status == CaseStatus.DONE, case.last_error
    assert [p.name for p in results.rglob("*")] == ["ok"]  # neither link came back, nor what they point at


def test_results_over_the_class_storage_fail_the_case_saying_so(r_pool, make_case, double):
    rc = r_pool.classes.get()
    rc.max_storage = 1
    rc.default_storage = 1
    rc.save()
    case = wait_for_terminal(launch(make_case, r_pool, "head -c 1100000000 /dev/zero > big 2>/dev/null || true"))
    assert case.status == CaseStatus.FAILED and "storage limit" in case.last_error


def test_a_runai_pool_without_image_or_volume_says_it_cannot_run_cases_yet(driver):
    from apps.backends.readiness import case_readiness

    pool = driver.service_pool(name="ready")
    assert case_readiness(pool).ready
    pool.remote = {k: v for k, v in pool.remote.items() if k != "image"}
    assert "names no container image" in case_readiness(pool).message
    pool.remote = {k: v for k, v in pool.remote.items() if k not in ("working_root", "host_path")}
    assert "no working directory" in case_readiness(pool).message


def test_a_per_user_runai_pool_names_its_project():
    pool = ResourcePool(name="p", kind="runai", remote={"base_url": "https://runai.example.org"})
    with pytest.raises(Exception, match="'project' is required for per-user credentials"):
        pool.full_clean()


def test_a_secret_or_token_runai_echoes_in_an_error_never_reaches_the_case_logs_api_or_admin(
    r_pool, make_case, double, caplog, api, owner, admin_client
):
    """R-BACK-1 with a provider that echoes the request's credential in its error answers
    (``echo_credentials``): the client secret at sign-in, the bearer token in a refused create
    and in a failed poll. Each error still says what happened, the credential replaced."""
    caplog.set_level(logging.DEBUG)
    # Sign-in answered 503, every attempt echoing the client secret: a launch retried later.
    double.fault("/api/v2/token$", status=503, times=rb_client.RETRIES + 1)
    double.echo_credentials = rb_client.RETRIES + 1
    signin = launch(make_case, r_pool, "true")
    assert signin.status == CaseStatus.PREPARED, signin.last_error
    assert "sign-in failed: the provider answered HTTP 503" in signin.last_error
    # A create refused (400) echoing the bearer token: the launch fails for good.
    double.fault("/api/v1/workloads/trainings$", status=400, times=1, method="POST")
    double.echo_credentials = 1
    refused = launch(make_case, r_pool, "true")
    assert refused.status == CaseStatus.FAILED, refused.last_error
    assert "submission failed: the provider answered HTTP 400" in refused.last_error
    # A poll answered 502 (each retry too), echoing the bearer token: a failed poll.
    double.hold = {"Pending"}
    polled = launch(make_case, r_pool, "true")
    double.fault(f"/api/v1/workloads/{polled.remote_id}$", status=502, times=rb_client.RETRIES + 1, method="GET")
    double.echo_credentials = rb_client.RETRIES + 1
    poll_once(polled)
    assert polled.poll_failures == 1 and "lookup failed: the provider answered HTTP 502" in polled.last_error
    assert double.echo_credentials == 0  # every echo was sent

    cases = [signin, refused, polled]
    for case in cases:
        # A service account's pool: its users read the status and a reference; the provider's
        # words, scrubbed, are in the log under that reference for the operators.
        assert "(reference " in case.last_error and "request credential" not in case.last_error
    assert "request credential: ***" in caplog.text
    texts = [caplog.text] + [case.last_error for case in cases]
    texts += [event.message for case in cases for event in case.events.all()]
    for case in cases:
        pages = [
            api(owner).get(f"/api/v1/cases/{case.id}/"),
            api(owner).get(f"/api/v1/cases/{case.id}/events/"),
            admin_client.get(f"/admin/cases/case/{case.id}/change/"),
        ]
        assert all(page.status_code == 200 for page in pages)
        texts += [page.content.decode() for page in pages]
    secrets = [RunaiDriver.secret, *double.tokens]
    assert len(secrets) > 1
    for text in texts:
        for secret in secrets:
            assert secret not in text


def test_f18_a_providers_echo_of_the_form_encoded_token_request_shows_users_no_secret_in_any_form(
    driver, double, api, owner, monkeypatch, caplog, settings
):
    """F18: scrubbing matched only the literal secret: a provider echoing the form-encoded token
    request showed a service Run:AI pool's secret, percent-encoded, to any user in launch options.
    Every form is scrubbed now (percent-, JSON-, Basic-encoded), and users of a service-account
    pool see the provider's status and a reference, never its answer's body."""
    import base64
    import json as json_module
    from urllib.parse import quote, quote_plus

    settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS = 0
    awkward = 's3cr/et+key=&x "quoted"'
    double.add_client("gridgate-awkward", awkward, "svc-awkward", "svc@example.org")
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_ID", "gridgate-awkward")
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_SECRET", awkward)
    pool = driver.service_pool(klass={"name": "a100", "cpu": "1.5"})
    double.fault("/api/v2/token$", status=400, times=rb_client.RETRIES + 1)
    double.echo_request_body = rb_client.RETRIES + 1
    caplog.set_level(logging.WARNING)
    answer = api(owner).get(f"/api/v1/resource-classes/{pool.classes.get().pk}/launch-options/").json()
    forms = [
        awkward,
        quote(awkward, safe=""),
        quote_plus(awkward),
        json_module.dumps(awkward)[1:-1],
        base64.b64encode(f"gridgate-awkward:{awkward}".encode()).decode().rstrip("="),
    ]
    assert answer["degraded"] and "answered HTTP 400 (reference " in answer["message"], answer
    assert "client_secret" not in answer["message"]
    for form in forms:
        assert form not in answer["message"] and form not in caplog.text, form
    assert "client_secret=***" in caplog.text  # the operators' log keeps the rest of the words
