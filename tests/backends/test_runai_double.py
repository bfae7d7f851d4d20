"""The Run:AI double reproduces what Run:AI does (tests/doubles/runai_server.py), driven by the
real runapy client where runapy has the call: each behaviour the backend relies on has a test
here, so the double cannot drift into a friendlier Run:AI."""

import pytest
import requests

from apps.backends import runai as rb
from apps.backends.runai import client as rb_client
from apps.credentials import oauth
from tests.backends.conftest import wait_until
from tests.doubles.runai_server import CLUSTER, RunaiDouble

SECRET = "runai-SVC-secret-6e5d4c"


@pytest.fixture(scope="module")
def double():
    server = RunaiDouble(client_id="svc", client_secret=SECRET, subject="svc-subject").start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh(double):
    double.reset()
    double.add_client("svc", SECRET, "svc-subject", "gridgate@example.org")
    yield
    double.reap()


@pytest.fixture
def client(double):
    return rb.build_client(double.url, "svc", SECRET)


def body(tmp_path, name="gg-abc", command="true", **compute):
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "job.sh").write_text(f'cd "$(dirname "$0")/work" && {command}\n')
    return {
        "name": name,
        "projectId": "4",
        "clusterId": CLUSTER,
        "spec": {
            "image": "x",
            "command": "/bin/sh",
            "args": "/mnt/job.sh",
            "workingDir": "/mnt/work",
            "compute": compute,
            "storage": {"hostPath": [{"name": "v", "path": str(tmp_path), "mountPath": "/mnt"}]},
        },
    }


def create(client, payload):
    sdk = rb_client._sdk()
    request = sdk["models"].TrainingCreationRequest.from_dict(payload)
    return sdk["api"].TrainingsApi(client).create_training1(request).data


def get(client, workload_id):
    return rb_client._sdk()["api"].WorkloadsApi(client).get_workload(workload_id).data


def test_the_token_is_a_jwt_from_the_v2_endpoint_with_subject_and_exp(double, client):
    claims = oauth.claims(client._token)
    assert claims["sub"] == "svc-subject" and claims["exp"] > 0
    assert [path for _m, path in double.calls] == ["/api/v2/token"]


def test_a_wrong_secret_is_refused_401_and_the_v1_token_endpoint_is_not_served(double):
    with pytest.raises(rb.TokenRefused) as refused:
        rb.build_client(double.url, "svc", "wrong")
    assert refused.value.status == 401
    assert requests.post(f"{double.url}/api/v1/token", json={}, timeout=5).status_code == 401


def test_expired_tokens_are_refused_before_their_exp(double, client):
    get_projects = rb_client._sdk()["api"].ProjectsApi(client).get_projects
    assert get_projects().data["projects"]
    double.expire_tokens()
    with pytest.raises(rb_client._sdk()["ApiException"]) as refused:
        get_projects()
    assert refused.value.status == 401


def test_projects_are_filtered_by_name_as_runapy_sends_the_filter(client):
    projects = rb_client._sdk()["api"].ProjectsApi(client).get_projects(filter_by=["name==team-b"]).data["projects"]
    assert [p["name"] for p in projects] == ["team-b"]


def test_a_workload_goes_through_the_phases_and_completes(double, client, tmp_path):
    answer = create(client, body(tmp_path, command="echo hi > out"))
    assert answer["actualPhase"] == "Creating"
    wait_until(lambda: get(client, answer["workloadId"])["phase"] == "Completed", what="completion")
    assert double.workloads[answer["workloadId"]].history == [
        "Creating",
        "Pending",
        "Initializing",
        "Running",
        "Completed",
    ]
    assert (tmp_path / "work" / "out").read_text() == "hi\n"  # the mount is the hostPath directory


def test_a_failed_container_is_failed_with_its_exit_code_in_phase_message(client, tmp_path):
    workload_id = create(client, body(tmp_path, command="exit 4"))["workloadId"]
    wait_until(lambda: get(client, workload_id)["phase"] == "Failed", what="failure")
    assert "exited with code 4" in get(client, workload_id)["phaseMessage"]


def test_a_deleted_workload_is_404_and_listed_only_among_the_deleted(double, client, tmp_path):
    api = rb_client._sdk()["api"]
    workload_id = create(client, body(tmp_path, command="sleep 30"))["workloadId"]
    api.TrainingsApi(client).delete_training(workload_id)
    wait_until(lambda: double.workloads[workload_id].deleted, what="deletion")
    with pytest.raises(rb_client._sdk()["ApiException"]) as missing:
        get(client, workload_id)
    assert missing.value.status == 404
    listed = api.WorkloadsApi(client).get_workloads(deleted=True, filter_by=["name==gg-abc"]).data["workloads"]
    assert [w["id"] for w in listed] == [workload_id]
    assert not api.WorkloadsApi(client).get_workloads(filter_by=["name==gg-abc"]).data["workloads"]


def test_a_second_workload_of_the_same_name_is_409(client, tmp_path):
    create(client, body(tmp_path, command="sleep 5"))
    with pytest.raises(rb_client._sdk()["ApiException"]) as conflict:
        create(client, body(tmp_path))
    assert conflict.value.status == 409


@pytest.mark.parametrize(
    "compute", [{"gpuPortionRequest": 0.5}, {"gpuRequestType": "portion", "gpuPortionRequest": 1.0}]
)
def test_a_gpu_portion_needs_the_portion_type_and_a_fraction(client, tmp_path, compute):
    with pytest.raises(rb_client._sdk()["ApiException"]) as refused:
        create(client, body(tmp_path, gpuDevicesRequest=1, **compute))
    assert refused.value.status == 400


def test_a_call_about_a_case_by_another_subject_is_refused_and_recorded(double, client, tmp_path):
    double.expect_owner("abc", "ada-subject")
    with pytest.raises(rb_client._sdk()["ApiException"]):
        create(client, body(tmp_path))
    assert double.violations and "belongs to ada-subject" in double.violations[0]
    double.violations.clear()


def test_faults_answer_with_their_status_and_retry_after(double, client):
    double.fault("/api/v1/clusters", status=429, times=1, headers={"Retry-After": "7"})
    answer = requests.get(f"{double.url}/api/v1/clusters", timeout=5)
    assert answer.status_code == 429 and answer.headers["Retry-After"] == "7"


def test_an_error_answer_echoes_the_requests_credential_when_asked(double, client):
    double.echo_credentials = 2
    refused = requests.post(
        f"{double.url}/api/v2/token",
        data={"grant_type": "client_credentials", "client_id": "svc", "client_secret": "wrong-secret"},
        timeout=5,
    )
    assert refused.status_code == 401 and "wrong-secret" in refused.json()["error_description"]
    double.fault("/api/v1/clusters", status=400, times=1)
    with pytest.raises(rb_client._sdk()["ApiException"]) as failed:
        rb_client._sdk()["api"].ClustersApi(client).get_clusters()
    assert client._token in str(failed.value.body)
    assert double.echo_credentials == 0
    answer = requests.get(f"{double.url}/api/v1/clusters", headers={"Authorization": "Bearer nope"}, timeout=5)
    assert answer.status_code == 401 and "nope" not in answer.text  # the echo is over


def test_an_expired_access_key_is_refused_at_the_token_endpoint(double):
    double.expire_client("svc")
    with pytest.raises(rb.TokenRefused) as refused:
        rb.build_client(double.url, "svc", SECRET)
    assert refused.value.status == 401 and "expired" in str(refused.value)
