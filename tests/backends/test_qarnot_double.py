"""The Qarnot double behaves like Qarnot as its SDK, tests and C# SDK describe it (PROVIDERS.md,
"Qarnot as the SDK … describe it"): one short test per behaviour, so the double cannot drift back
to a friendlier API than the real one."""

import botocore.exceptions
import pytest
import qarnot
import requests

from tests.doubles.qarnot_server import QarnotDouble

TOKEN = "qarnot-TOKEN-value-9f8e7d"


@pytest.fixture(scope="module")
def double():
    server = QarnotDouble(token=TOKEN).start()
    yield server
    server.reap()
    server.stop()


@pytest.fixture(autouse=True)
def fresh(double):
    double.hold = set()
    double.max_tasks = None
    double.credits = True
    double.user = {"email": "gridgate@example.org", "maxBucket": 50, "quotaBytesBucket": 10 << 30}


def post(double, path, body=None, token=TOKEN):
    return requests.post(f"{double.url}{path}", json=body or {}, headers={"Authorization": token}, timeout=5)


def get(double, path, token=TOKEN):
    return requests.get(f"{double.url}{path}", headers={"Authorization": token}, timeout=5)


def submit(double, command="true", tags=("t",), **fields):
    """A task running ``command``, with ``fields`` besides."""
    constants = [{"key": "DOCKER_CMD", "value": command}]
    body = {"name": "task", "profile": "docker-batch", "instanceCount": 1, "tags": list(tags), "constants": constants}
    return post(double, "/tasks", {**body, **fields})


def uuid_of(answer):
    assert answer.status_code == 201, answer.text
    return answer.json()["uuid"]


def test_double_goes_through_the_dispatch_and_execution_states(double):
    uuid = uuid_of(submit(double))
    double.wait_state(uuid, ("Success",))
    assert double.tasks[uuid].history == [
        "Submitted",
        "PartiallyDispatched",
        "FullyDispatched",
        "PartiallyExecuting",
        "FullyExecuting",
        "UploadingResults",
        "Success",
    ]


@pytest.mark.parametrize("window", ["Submitted", "UploadingResults"])
def test_double_abort_passes_through_pending_cancel_and_is_never_undone(double, window):
    double.hold = {window}
    uuid = uuid_of(submit(double))
    double.wait_state(uuid, (window,))
    assert post(double, f"/tasks/{uuid}/abort").status_code == 200
    double.hold = set()
    double.tasks[uuid].runner.join(10)  # the runner is done: nothing can flip the state back
    history = double.tasks[uuid].history
    assert double.tasks[uuid].state == "Cancelled" and "Success" not in history
    assert history[history.index(window) + 1 :] == ["PendingCancel", "Cancelled"]


def test_double_abort_of_a_finished_task_answers_403_non_running(double):
    uuid = uuid_of(submit(double))
    double.wait_state(uuid, ("Success",))
    answer = post(double, f"/tasks/{uuid}/abort")
    assert answer.status_code == 403 and "non-running" in answer.json()["message"]
    cancelled = uuid_of(submit(double, "sleep 30"))
    double.wait_state(cancelled, ("FullyExecuting",))
    post(double, f"/tasks/{cancelled}/abort")
    double.wait_state(cancelled, ("Cancelled",))
    assert post(double, f"/tasks/{cancelled}/abort").status_code == 403
    assert double.tasks[cancelled].state == "Cancelled"


def test_double_reports_failures_per_instance_not_in_errors(double):
    uuid = uuid_of(submit(double, "sh -c 'exit 3'"))
    double.wait_state(uuid, ("Failure",))
    body = get(double, f"/tasks/{uuid}").json()
    assert body["errors"] == []
    (instance,) = body["completedInstances"]
    assert instance["state"] == "Failure" and "code 3" in instance["error"]["message"]


def test_double_ends_a_task_it_cannot_store_in_failure_instead_of_leaving_it_running(double):
    """The double's own failures (here: its results upload into a bucket that does not exist)
    end the task in Failure naming the error, so a test waiting for the task fails at once with
    the cause instead of waiting out its timeout."""
    double.s3.create_bucket(Bucket="vanishing-results")
    double.hold = {"FullyExecuting"}
    uuid = uuid_of(submit(double, "sh -c 'echo x > out.txt'", resultBucket="vanishing-results"))
    double.wait_state(uuid, ("FullyExecuting",))
    double.s3.delete_bucket(Bucket="vanishing-results")  # gone before the results are uploaded
    double.hold = set()
    double.wait_state(uuid, ("Failure",))
    (instance,) = double.tasks[uuid].completed
    assert "The Qarnot double failed" in instance["error"]["message"]
    assert "NoSuchBucket" in instance["error"]["message"]


def test_double_tag_filters_are_exact_and_task_pages_truncated_with_a_next_token(double):
    one = uuid_of(submit(double, tags=["case-1"]))
    uuid_of(submit(double, tags=["case-10"]))
    conn = qarnot.connection.Connection(client_token=TOKEN, cluster_url=double.url)
    assert [task.uuid for task in conn.all_tasks(summary=False, tags=["case-1"])] == [one]
    for _ in range(3):
        uuid_of(submit(double, tags=["paged"]))
    first = post(double, "/tasks/paginate", {"filter": {"operator": "Equal", "field": "Tags", "value": "paged"}}).json()
    assert first["isTruncated"] is True and first["nextToken"] and len(first["data"]) == double.page_size
    assert len(list(conn.all_tasks(summary=False, tags=["paged"]))) == 3


def test_double_storage_enforces_the_quota_mid_upload(double):
    double.s3.create_bucket(Bucket="quota-test")
    double.user["quotaBytesBucket"] = double.used_bytes() + 10
    with pytest.raises(botocore.exceptions.ClientError) as info:
        double.s3.put_object(Bucket="quota-test", Key="big", Body=b"x" * 100)
    assert info.value.response["Error"]["Code"] == "QuotaExceeded"
    double.s3.put_object(Bucket="quota-test", Key="small", Body=b"x")


def test_double_answers_max_tasks_with_403_and_missing_credits_with_402(double):
    double.max_tasks = 0
    answer = submit(double)
    assert answer.status_code == 403 and "Maximum number of tasks reached" in answer.json()["message"]
    double.max_tasks = None
    double.credits = False
    assert submit(double).status_code == 402


def test_double_hides_another_accounts_tasks_and_records_a_call_about_a_case_of_another_account(double):
    double.add_account("other-token", "other@example.org")
    uuid = submit(double).json()["uuid"]
    assert get(double, f"/tasks/{uuid}", token="other-token").status_code == 404  # another account's does not exist
    double.expect_owner("owned-case", "gridgate@example.org")
    body = {"name": "owned-case", "profile": "docker-batch", "instanceCount": 1}
    refused = post(double, "/tasks", body, token="other-token")
    assert refused.status_code == 403 and "owned-case" in double.violations[-1]
    double.revoke("other-token")
    assert get(double, "/info", token="other-token").status_code == 401
    double.violations.clear()
    double.case_owners.clear()
