"""The case, campaign and backend endpoints of SPEC §7."""

import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.backends.fake import FakeBackend
from apps.cases import passes, services, workspace
from apps.cases.models import Case, CaseStatus
from apps.core.exceptions import Invalid
from tests.cases.conftest import drive

pytestmark = pytest.mark.django_db

CASE_FIELDS = {
    "id",
    "name",
    "owner",
    "resource_class",
    "backend",
    "command",
    "launch_options",
    "observability_globs",
    "status",
    "remote_id",
    "remote_identity",
    "progress",
    "execution_time",
    "cores",
    "launch_requested_at",
    "status_message",
    "submitted_at",
    "started_at",
    "finished_at",
    "poll_failures",
    "last_error",
    "results_fetched",
}


def submit_now(case_id):
    """The worker's half of a launch (R-CASE-1), run here instead of through the broker."""
    passes.submit_pass(case_ids=[case_id])


def create(client, rc, **extra):
    body = {"name": "cavity", "resource_class": rc.pk, "command": "solve", **extra}
    return client.post("/api/v1/cases/", body, format="json")


def test_create_case_as_json_returns_the_spec_payload(api, owner, local_pool):
    response = create(api(owner), local_pool.classes.get(), observability_globs=["*.log"])
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == CASE_FIELDS
    assert body["status"] == "prepared" and body["owner"] == "owner" and body["backend"] == "fake"
    root = workspace.case_dir(body["id"])
    assert all((root / name).is_dir() for name in ("inputs", "live", "results"))
    assert (root / "stdout.log").exists() and (root / "stderr.log").exists()


def test_create_case_multipart_with_inputs(api, owner, local_pool):
    rc = local_pool.classes.get()
    response = api(owner).post(
        "/api/v1/cases/",
        {
            "name": "mesh",
            "resource_class": rc.pk,
            "command": "solve",
            "launch_options": '{"outcome": "succeed"}',
            "inputs": [SimpleUploadedFile("a.txt", b"alpha"), SimpleUploadedFile("b.dat", b"beta")],
        },
        format="multipart",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["launch_options"] == {"outcome": "succeed"}
    files = api(owner).get(f"/api/v1/cases/{body['id']}/files/").json()["results"]
    assert {"path": "inputs/a.txt", "size": 5} in files and {"path": "inputs/b.dat", "size": 4} in files


def test_user_without_pool_access_cannot_create_a_case_there(api, outsider, private_pool):
    response = create(api(outsider), private_pool.classes.get())
    assert response.status_code == 400 and "resource_class" in response.json()


def test_a_case_prepared_while_granted_is_not_launched_once_the_grant_is_withdrawn(api, member, private_pool):
    """R-POOL-8: a private pool is usable only by its granted users. Creating a case checked the
    grant but launching it did not, so a member removed from the pool's group kept running the
    cases they had prepared there (a prepared case never expires)."""
    case_id = create(api(member), private_pool.classes.get()).json()["id"]
    member.groups.clear()  # the operators withdraw the grant
    response = api(member).post(f"/api/v1/cases/{case_id}/launch/", {}, format="json")
    assert response.status_code == 403, response.content
    assert "qpu" in response.json()["detail"]
    case = Case.objects.get(pk=case_id)
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None


def test_outsiders_get_404_on_every_case_route(api, owner, outsider, local_pool):
    case_id = create(api(owner), local_pool.classes.get()).json()["id"]
    client = api(outsider)
    for method, path in [
        ("get", f"/api/v1/cases/{case_id}/"),
        ("get", f"/api/v1/cases/{case_id}/events/"),
        ("get", f"/api/v1/cases/{case_id}/logs/"),
        ("get", f"/api/v1/cases/{case_id}/files/"),
        ("get", f"/api/v1/cases/{case_id}/files/stdout.log"),
        ("post", f"/api/v1/cases/{case_id}/launch/"),
        ("post", f"/api/v1/cases/{case_id}/cancel/"),
        ("post", f"/api/v1/cases/{case_id}/refresh/"),
        ("post", f"/api/v1/cases/{case_id}/inputs/"),
    ]:
        assert getattr(client, method)(path).status_code == 404, path
    assert client.get("/api/v1/cases/").json()["count"] == 0
    assert Case.objects.get(pk=case_id).status == CaseStatus.PREPARED


def test_staff_see_every_case(api, owner, staff, local_pool):
    create(api(owner), local_pool.classes.get())
    assert api(staff).get("/api/v1/cases/").json()["count"] == 1


def test_staff_cannot_launch_or_upload_into_another_users_case(api, owner, staff, local_pool):
    """SPEC §7: launch and inputs are owner-only (staff may cancel or refresh, not act as owner)."""
    case_id = create(api(owner), local_pool.classes.get()).json()["id"]
    client = api(staff)
    upload = {"inputs": [SimpleUploadedFile("m.txt", b"1")]}
    assert client.post(f"/api/v1/cases/{case_id}/inputs/", upload, format="multipart").status_code == 403
    assert client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json").status_code == 403
    case = Case.objects.get(pk=case_id)
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None
    assert list((workspace.case_dir(case_id) / "inputs").iterdir()) == []


def test_a_launch_on_a_pool_not_set_up_here_is_refused_by_the_api_as_by_the_page(api, owner, local_pool, monkeypatch):
    """The host's readiness (``case_readiness``: the backend's tools, its settings) is a launch rule:
    the page refused such a launch while the API recorded it for the worker to fail. Both refuse it
    now, with the same words, and record nothing."""
    from django.test import Client
    from django.urls import reverse

    monkeypatch.setattr(FakeBackend, "commands", ("gridgate-no-such-tool",))
    case_id = create(api(owner), local_pool.classes.get()).json()["id"]
    response = api(owner).post(f"/api/v1/cases/{case_id}/launch/", {}, format="json")
    assert response.status_code == 400
    assert "the cluster's tools are not installed here" in response.json()["detail"]
    browser = Client()
    browser.force_login(owner)
    page = browser.post(reverse("web:case-launch", args=[case_id]), follow=True).content.decode()
    assert "the cluster&#x27;s tools are not installed here" in page
    with pytest.raises(Invalid, match="the cluster's tools are not installed here"):
        services.launch_case(Case.objects.get(pk=case_id))  # no user: a script, the shell
    case = Case.objects.get(pk=case_id)
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None


def test_launch_run_and_fetch_result_through_the_api(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    response = client.post(
        f"/api/v1/cases/{case_id}/launch/", {"launch_options": {"outcome": "succeed"}}, format="json"
    )
    assert response.status_code == 202 and response.json()["status"] == "prepared"
    submit_now(case_id)
    assert client.get(f"/api/v1/cases/{case_id}/").json()["status"] == "pending"
    drive(Case.objects.get(pk=case_id))
    body = client.get(f"/api/v1/cases/{case_id}/").json()
    assert body["status"] == "done" and body["results_fetched"] is True and body["progress"] == 1.0

    download = client.get(f"/api/v1/cases/{case_id}/files/results/result.txt")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == f"fake result of {case_id}\n".encode()

    logs = client.get(f"/api/v1/cases/{case_id}/logs/?stream=stdout&tail=1")
    assert logs.status_code == 200 and logs["Content-Type"].startswith("text/plain")
    assert logs.content.decode() == "step 4/4: succeeded\n"

    events = client.get(f"/api/v1/cases/{case_id}/events/").json()["results"]
    assert [e["to_status"] for e in events if e["to_status"]] == ["prepared", "pending", "running", "done"]
    launch = next(e for e in events if e["kind"] == "launch")
    assert launch["options"] == {"outcome": "succeed"}


def test_logs_reject_unknown_stream(api, owner, local_pool):
    case_id = create(api(owner), local_pool.classes.get()).json()["id"]
    assert api(owner).get(f"/api/v1/cases/{case_id}/logs/?stream=env").status_code == 400
    assert api(owner).get(f"/api/v1/cases/{case_id}/logs/?tail=x").status_code == 400


def test_cancel_after_completion_is_409_with_status(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json")
    submit_now(case_id)
    drive(Case.objects.get(pk=case_id))
    response = client.post(f"/api/v1/cases/{case_id}/cancel/")
    assert response.status_code == 409 and response.json()["status"] == "done"


def test_r_case_7_path_traversal_is_refused(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    for path in ["../../../../etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd", "inputs/../../x", "%2Fetc%2Fpasswd"]:
        response = client.get(f"/api/v1/cases/{case_id}/files/{path}")
        # Every one of these matches the download route: refused by the confinement check, 400
        # (a 404 would also pass for a route that never reached the check at all).
        assert response.status_code == 400, path
        assert "R-CASE-7" in response.json()["path"][0], path
        assert b"root:" not in b"".join(getattr(response, "streaming_content", [response.content]))


def test_r_case_7_symlink_out_of_the_workspace_is_refused(api, owner, local_pool, tmp_path):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, workspace.case_dir(case_id) / "results" / "leak.txt")
    os.symlink(tmp_path, workspace.case_dir(case_id) / "results" / "outside")
    assert client.get(f"/api/v1/cases/{case_id}/files/results/leak.txt").status_code == 400
    assert client.get(f"/api/v1/cases/{case_id}/files/results/outside/secret.txt").status_code == 400
    listed = [entry["path"] for entry in client.get(f"/api/v1/cases/{case_id}/files/").json()["results"]]
    assert not any("leak" in path or "outside" in path for path in listed)


def test_files_list_is_paginated_in_path_order_with_the_total(api, owner, local_pool):
    """The standard page shape ({"count", "next", "previous", "results"}, plus ``unlisted``), by
    path, however the walk met the files."""
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    results = workspace.case_dir(case_id) / "results"
    (results / "z" / "deep").mkdir(parents=True)
    for name in ("b.txt", "a-b.txt", "a/x.txt", "z/deep/y.txt", "a.txt"):
        (results / name).parent.mkdir(exist_ok=True)
        (results / name).write_text("12")
    first = client.get(f"/api/v1/cases/{case_id}/files/?page_size=3").json()
    assert set(first) == {"count", "next", "previous", "results", "unlisted"}
    assert first["count"] == 7 and first["previous"] is None and first["unlisted"] == 0
    paths = [entry["path"] for entry in first["results"]]
    while first["next"]:
        first = client.get(first["next"]).json()
        paths += [entry["path"] for entry in first["results"]]
    assert paths == sorted(paths) and len(paths) == 7
    assert paths[:5] == ["results/a-b.txt", "results/a.txt", "results/a/x.txt", "results/b.txt", "results/z/deep/y.txt"]
    assert client.get(f"/api/v1/cases/{case_id}/files/?page=9").status_code == 404


def test_a_page_of_files_holds_at_most_500(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    for i in range(501):
        (workspace.case_dir(case_id) / "results" / f"f{i:03d}").touch()
    page = client.get(f"/api/v1/cases/{case_id}/files/?page_size=10000").json()
    assert len(page["results"]) == 500 and page["count"] == 503 and page["next"]


def test_files_named_with_control_characters_are_listed_and_served_and_undecodable_ones_counted(api, owner, local_pool):
    """A command may name its files anything; the API never answers 500 for them."""
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    results = workspace.case_dir(case_id) / "results"
    names = ["new\nline", "cr\rname", "trail\n", "x" * 255, "..x", "a\\b", "%41"]
    for name in names:
        (results / name).write_text(name)
    with open(os.fsencode(results) + b"/bad\xff", "wb") as handle:
        handle.write(b"never served")
    page = client.get(f"/api/v1/cases/{case_id}/files/?page_size=500").json()
    listed = {entry["path"] for entry in page["results"]}
    assert {f"results/{name}" for name in names} <= listed and page["unlisted"] == 1
    from urllib.parse import quote

    for name in names:
        response = client.get(f"/api/v1/cases/{case_id}/files/{quote(f'results/{name}')}")
        assert response.status_code == 200, name
        assert b"".join(response.streaming_content).decode() == name
        assert "\n" not in response["Content-Disposition"] and "\r" not in response["Content-Disposition"]
    assert client.get(f"/api/v1/cases/{case_id}/files/results/bad%FF").status_code == 404


def test_r_case_7_oversized_upload_is_413_and_writes_nothing(api, owner, local_pool, settings):
    settings.GRIDGATE_MAX_UPLOAD_MB = 1
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    big = SimpleUploadedFile("big.bin", b"x" * (1024 * 1024 + 1))
    small = SimpleUploadedFile("small.txt", b"ok")
    response = client.post(f"/api/v1/cases/{case_id}/inputs/", {"inputs": [small, big]}, format="multipart")
    assert response.status_code == 413
    root = workspace.case_dir(case_id)
    assert list((root / "inputs").iterdir()) == []
    assert not [p for p in root.iterdir() if p.name.startswith(".upload")]


def test_r_case_7_oversized_files_at_creation_are_413_and_leave_no_case(api, owner, local_pool, settings):
    settings.GRIDGATE_MAX_UPLOAD_MB = 1
    rc = local_pool.classes.get()
    response = api(owner).post(
        "/api/v1/cases/",
        {"name": "big", "resource_class": rc.pk, "command": "x", "inputs": [SimpleUploadedFile("b", b"x" * 2**21)]},
        format="multipart",
    )
    assert response.status_code == 413
    assert Case.objects.count() == 0
    assert not any(workspace.cases_root().glob("*/inputs/*"))


def test_r_case_7_size_check_applies_to_the_declared_total_too(settings, tmp_path):
    from apps.cases.workspace import PayloadTooLarge, save_uploads

    settings.GRIDGATE_MAX_UPLOAD_MB = 1
    files = [SimpleUploadedFile(f"f{i}", b"x" * 400_000) for i in range(3)]
    with pytest.raises(PayloadTooLarge):
        save_uploads(tmp_path / "inputs", files)
    assert not (tmp_path / "inputs").exists() or not any((tmp_path / "inputs").iterdir())


def test_inputs_only_while_prepared(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    ok = client.post(
        f"/api/v1/cases/{case_id}/inputs/", {"inputs": [SimpleUploadedFile("m.txt", b"1")]}, format="multipart"
    )
    assert ok.status_code == 201 and ok.json() == {"uploaded": ["m.txt"]}
    client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json")
    submitting = client.post(
        f"/api/v1/cases/{case_id}/inputs/", {"inputs": [SimpleUploadedFile("n.txt", b"2")]}, format="multipart"
    )
    assert submitting.status_code == 409 and submitting.json()["status"] == "prepared"  # the worker uploads them
    submit_now(case_id)
    late = client.post(
        f"/api/v1/cases/{case_id}/inputs/", {"inputs": [SimpleUploadedFile("n.txt", b"2")]}, format="multipart"
    )
    assert late.status_code == 409 and late.json()["status"] == "pending"


def test_refresh_is_throttled_per_case_and_never_polls_in_the_request(api, owner, local_pool, settings, monkeypatch):
    """R-CASE-2: a refresh enqueues the passes for a worker and answers the recorded state."""
    settings.GRIDGATE_CASE_REFRESH_SECONDS = 60
    sent = []
    monkeypatch.setattr("apps.cases.passes.enqueue_refresh", lambda ids: sent.append([str(i) for i in ids]))
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json")
    submit_now(case_id)
    first = client.post(f"/api/v1/cases/{case_id}/refresh/")
    assert first.status_code == 200 and first.json()["status"] == "pending"
    assert "poll" not in FakeBackend.calls and "sync" not in FakeBackend.calls
    assert sent == [[case_id]]
    second = client.post(f"/api/v1/cases/{case_id}/refresh/")
    assert second.status_code == 429
    assert sent == [[case_id]]


def test_failed_submit_through_the_api_reports_failed(api, owner, local_pool):
    FakeBackend.faults.fail_submit = 1
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    assert client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json").status_code == 202
    submit_now(case_id)
    body = client.get(f"/api/v1/cases/{case_id}/").json()
    assert body["status"] == "failed" and "submission refused" in body["last_error"]


def test_bad_payloads_are_400_not_500(api, owner, local_pool):
    client = api(owner)
    rc = local_pool.classes.get()
    assert create(client, rc, observability_globs="*.log").status_code == 400
    assert create(client, rc, observability_globs=["../x"]).status_code == 400
    assert create(client, rc, command="  ").status_code == 400
    case_id = create(client, rc).json()["id"]
    assert client.post(f"/api/v1/cases/{case_id}/launch/", {"launch_options": [1]}, format="json").status_code == 400


def test_campaign_shared_inputs_are_seen_by_its_cases(api, owner, local_pool):
    client = api(owner)
    response = client.post(
        "/api/v1/campaigns/", {"name": "sweep", "inputs": [SimpleUploadedFile("mesh.msh", b"mesh")]}, format="multipart"
    )
    assert response.status_code == 201, response.content
    campaign = response.json()
    assert campaign["shared_files"] == [{"path": "mesh.msh", "size": 4}]
    more = client.post(
        f"/api/v1/campaigns/{campaign['id']}/inputs/", {"inputs": [SimpleUploadedFile("p", b"1")]}, format="multipart"
    )
    assert more.status_code == 201
    case = create(client, local_pool.classes.get(), campaign=campaign["id"])
    assert case.status_code == 201
    assert client.get(f"/api/v1/campaigns/{campaign['id']}/").json()["name"] == "sweep"


def test_campaign_shared_inputs_are_frozen_once_a_case_launch_is_requested(api, owner, local_pool):
    """R-CASE-7 for shared/: from the launch request on (still ``prepared`` while the worker
    submits, and reading shared/ to upload it), not only once a case is pending."""
    client = api(owner)
    campaign = client.post("/api/v1/campaigns/", {"name": "sweep"}, format="json").json()
    url = f"/api/v1/campaigns/{campaign['id']}/inputs/"
    case_id = create(client, local_pool.classes.get(), campaign=campaign["id"]).json()["id"]
    assert client.post(url, {"inputs": [SimpleUploadedFile("a", b"1")]}, format="multipart").status_code == 201
    assert client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json").status_code == 202
    submitting = client.post(url, {"inputs": [SimpleUploadedFile("b", b"2")]}, format="multipart")
    assert submitting.status_code == 409 and "frozen" in submitting.json()["detail"]
    submit_now(case_id)
    assert client.post(url, {"inputs": [SimpleUploadedFile("b", b"2")]}, format="multipart").status_code == 409
    assert client.get(f"/api/v1/campaigns/{campaign['id']}/").json()["shared_files"] == [{"path": "a", "size": 1}]


def test_campaigns_of_others_are_404_and_unusable(api, owner, outsider, local_pool):
    campaign = api(owner).post("/api/v1/campaigns/", {"name": "mine"}, format="json").json()
    assert api(outsider).get(f"/api/v1/campaigns/{campaign['id']}/").status_code == 404
    response = create(api(outsider), local_pool.classes.get(), campaign=campaign["id"])
    assert response.status_code == 400 and "campaign" in response.json()


def test_backends_list_names_the_kinds_they_serve(api, member):
    body = api(member).get("/api/v1/backends/").json()
    by_name = {entry["name"]: entry["kinds"] for entry in body}
    assert by_name["fake"] == ["local"] and by_name["slurm"] == ["slurm"] and by_name["local"] == []


def test_r_back_2_healthy_launch_options_are_cached(api, member, local_pool):
    calls = []
    original = FakeBackend.launch_options

    def counting(self, pool, identity=None):
        calls.append(pool.pk)
        return original(self, pool, identity)

    FakeBackend.launch_options = counting
    try:
        url = f"/api/v1/resource-classes/{local_pool.classes.get().pk}/launch-options/"
        first = api(member).get(url).json()
        second = api(member).get(url).json()
    finally:
        FakeBackend.launch_options = original
    assert first == second and first["degraded"] is False and first["backend"] == "fake"
    assert first["options"][0]["key"] == "outcome"
    assert len(calls) == 1


def test_r_back_1_a_secret_in_a_launch_options_error_is_not_returned(api, member, local_pool, monkeypatch):
    monkeypatch.setenv("GRIDGATE_CRED_TEST_TOKEN", "s3cr3t-token-value")
    local_pool.remote = {"token_env": "GRIDGATE_CRED_TEST_TOKEN"}
    local_pool.save(update_fields=["remote"])

    def leaky(self, pool, identity=None):
        raise ConnectionError("refused: Authorization s3cr3t-token-value")

    monkeypatch.setattr(FakeBackend, "launch_options", leaky)
    response = api(member).get(f"/api/v1/resource-classes/{local_pool.classes.get().pk}/launch-options/")
    assert response.status_code == 200 and response.json()["degraded"] is True
    assert b"s3cr3t-token-value" not in response.content and "***" in response.json()["message"]


def test_r_back_2_degraded_launch_options_are_not_cached(api, member, local_pool, monkeypatch):
    calls = []

    def unreachable(self, pool, identity=None):
        calls.append(1)
        raise ConnectionError("provider down")

    monkeypatch.setattr(FakeBackend, "launch_options", unreachable)
    url = f"/api/v1/resource-classes/{local_pool.classes.get().pk}/launch-options/"
    for _ in range(2):
        body = api(member).get(url).json()
        assert body["degraded"] is True and "provider down" in body["message"]
    assert len(calls) == 2


def test_launch_options_of_a_hidden_class_are_404(api, outsider, private_pool):
    url = f"/api/v1/resource-classes/{private_pool.classes.get().pk}/launch-options/"
    assert api(outsider).get(url).status_code == 404


def test_openapi_schema_has_the_case_routes(tmp_path):
    from django.core.management import call_command

    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    for path in [
        "/api/v1/cases/{id}/launch/",
        "/api/v1/cases/{id}/files/{path}:",
        "/api/v1/campaigns/{id}/inputs/",
        "/api/v1/backends/",
        "/api/v1/resource-classes/{id}/launch-options/",
    ]:
        assert path in text, path


def test_idempotency_key_replays_case_creation_with_the_same_files(api, owner, local_pool):
    rc = local_pool.classes.get()
    client = api(owner)

    def post(content):
        return client.post(
            "/api/v1/cases/",
            {
                "name": "mesh",
                "resource_class": rc.pk,
                "command": "run",
                "inputs": [SimpleUploadedFile("a.txt", content)],
            },
            format="multipart",
            HTTP_IDEMPOTENCY_KEY="case-1",
        )

    first, again = post(b"one"), post(b"one")
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["id"] == again.json()["id"] and again["Idempotent-Replayed"] == "true"
    assert post(b"two").status_code == 409  # same key, different file content
    assert Case.objects.count() == 1


def test_idempotency_key_on_launch_never_launches_twice(api, owner, local_pool):
    case_id = create(api(owner), local_pool.classes.get()).json()["id"]
    client = api(owner)
    url = f"/api/v1/cases/{case_id}/launch/"
    first = client.post(url, {"launch_options": {}}, format="json", HTTP_IDEMPOTENCY_KEY="launch-1")
    again = client.post(url, {"launch_options": {}}, format="json", HTTP_IDEMPOTENCY_KEY="launch-1")
    assert first.status_code == 202 and first.json() == again.json()
    submit_now(case_id)
    again = client.post(url, {"launch_options": {}}, format="json", HTTP_IDEMPOTENCY_KEY="launch-1")
    assert again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert Case.objects.get(pk=case_id).events.filter(kind="launch").count() == 1
    assert Case.objects.get(pk=case_id).events.filter(to_status="pending").count() == 1
    assert FakeBackend.calls["submit"] == 1


# -- R-BACK-6: launch options are an allow-list -----------------------------------------------------
def test_r_back_6_a_value_outside_the_declared_choices_is_400_at_creation_naming_them(api, owner, local_pool):
    response = create(api(owner), local_pool.classes.get(), launch_options={"outcome": "explode"})
    assert response.status_code == 400
    body = response.json()
    assert "one of succeed, fail" in body["detail"] and "outcome" in body["launch_options"]
    assert not Case.objects.exists()


def test_r_back_6_an_undeclared_option_at_launch_is_400_and_nothing_is_submitted(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    response = client.post(
        f"/api/v1/cases/{case_id}/launch/",
        {"launch_options": {"partition": "gpu-premium", "time": "365-00:00:00"}},
        format="json",
    )
    assert response.status_code == 400
    assert "declared options: outcome" in response.json()["detail"]
    case = Case.objects.get(pk=case_id)
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None and not case.remote_id
    assert FakeBackend.calls.get("submit", 0) == 0


def test_r_back_6_a_newline_in_a_launch_option_is_400(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    response = client.post(
        f"/api/v1/cases/{case_id}/launch/", {"launch_options": {"outcome": "succeed\ntouch pwned"}}, format="json"
    )
    assert response.status_code == 400 and "control characters" in response.json()["detail"]


def test_launch_key_of_a_request_that_died_is_free_again_at_once(api, owner, local_pool, monkeypatch):
    """The launch records itself in one transaction with its Idempotency-Key (a worker submits
    later), so a request killed inside its work leaves no key behind: the retry with the same key
    launches at once instead of answering 409 for 24 hours."""
    from apps.core.models import IdempotencyKey

    case_id = create(api(owner), local_pool.classes.get()).json()["id"]
    url = f"/api/v1/cases/{case_id}/launch/"
    client = api(owner)
    monkeypatch.setattr(
        "apps.cases.services.launch_case", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed"))
    )
    assert client.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="launch-dead").status_code == 500
    monkeypatch.undo()
    assert not IdempotencyKey.objects.filter(key="launch-dead").exists()
    launched = client.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="launch-dead")
    assert launched.status_code == 202, launched.content
    replay = client.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="launch-dead")
    assert replay.status_code == 202 and replay.json() == launched.json()
    assert IdempotencyKey.objects.get(key="launch-dead").response_status == 202


def raw_multipart(files: dict[str, bytes], **fields) -> tuple[bytes, str]:
    """A multipart body with file names exactly as given (test clients cut them to base names)."""
    boundary = "gridgate-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode()
        for key, value in fields.items()
    ]
    for name, content in files.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="inputs"; filename="{name}"\r\n'
        parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + content + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("name", ["../evil.txt", "sub/a.txt", "..\\\\evil.txt", "/etc/passwd", ".."])
def test_upload_name_with_a_directory_part_is_refused_naming_the_file(api, owner, local_pool, name):
    """R-CASE-7: no silent cut to the base name."""
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    body, content_type = raw_multipart({name: b"x"})
    response = client.generic("POST", f"/api/v1/cases/{case_id}/inputs/", body, content_type=content_type)
    assert response.status_code == 400, response.content
    assert "not a plain file name" in response.json()["detail"]
    assert not any(
        entry["path"].startswith("inputs/") for entry in client.get(f"/api/v1/cases/{case_id}/files/").json()["results"]
    )


def test_upload_never_overwrites_an_earlier_input_silently(api, owner, local_pool):
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    url = f"/api/v1/cases/{case_id}/inputs/"
    first = client.post(url, {"inputs": [SimpleUploadedFile("m.txt", b"first")]}, format="multipart")
    assert first.status_code == 201
    again = client.post(
        url,
        {"inputs": [SimpleUploadedFile("n.txt", b"new"), SimpleUploadedFile("m.txt", b"second")]},
        format="multipart",
    )
    assert again.status_code == 409 and again.json()["file"] == "m.txt" and "m.txt" in again.json()["detail"]
    files = client.get(f"/api/v1/cases/{case_id}/files/").json()["results"]
    assert {"path": "inputs/m.txt", "size": 5} in files  # the first content, untouched
    assert not any(entry["path"] == "inputs/n.txt" for entry in files)  # all or nothing


def test_r_case_7_oversized_request_is_refused_before_its_body_is_parsed(api, owner, local_pool, settings, monkeypatch):
    """R-CASE-7: the Content-Length pre-check answers 413 before the multipart body is parsed
    (and spooled to disk); the per-file check behind it never even runs."""
    settings.GRIDGATE_MAX_UPLOAD_MB = 1
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    reached = []
    monkeypatch.setattr(workspace, "save_uploads", lambda *args, **kwargs: reached.append(args) or [])
    big = SimpleUploadedFile("big.bin", b"x" * (1024 * 1024 + 1))
    response = client.post(f"/api/v1/cases/{case_id}/inputs/", {"inputs": [big]}, format="multipart")
    assert response.status_code == 413 and reached == []


def test_upload_name_longer_than_the_filesystem_allows_is_400_not_500(api, owner, local_pool):
    """255 characters fit Django's limit but 200 × 'é' is 400 bytes: a clear 400, nothing written."""
    client = api(owner)
    case_id = create(client, local_pool.classes.get()).json()["id"]
    name = "é" * 200 + ".txt"
    response = client.post(
        f"/api/v1/cases/{case_id}/inputs/", {"inputs": [SimpleUploadedFile(name, b"x")]}, format="multipart"
    )
    assert response.status_code == 400, response.content
    assert "too long" in str(response.json())


@pytest.mark.parametrize("field", ["resource_class", "campaign"])
def test_filtering_cases_by_others_classes_or_campaigns_answers_as_for_ids_that_do_not_exist(
    api, owner, outsider, private_pool, field
):
    """R-POOL-8 and "another user's object is 404": ``?resource_class=`` and ``?campaign=`` were
    checked against every class and campaign, so a hidden pool's class or another user's campaign
    gave an empty list where a missing id gave a 400."""
    import uuid

    hidden = {
        "resource_class": (private_pool.classes.get().pk, 10**6),
        "campaign": (services.create_campaign(owner=owner, name="theirs").pk, uuid.uuid4()),
    }[field]
    client = api(outsider)
    answers = [client.get(f"/api/v1/cases/?{field}={value}") for value in hidden]
    assert answers[0].status_code == answers[1].status_code
    assert answers[0].json() == answers[1].json()
