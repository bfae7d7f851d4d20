"""The FirecREST double behaves like the real FirecREST v2 server (PROVIDERS.md, "The real
FirecREST v2 server, observed"): one short test per behaviour, so the double cannot drift back to
a friendlier server than the one sites run."""

import time

import pytest
import requests

from tests.doubles.firecrest_server import FirecrestDouble

SECRET = "s3cr3t-client-VALUE-42"


@pytest.fixture
def double(tmp_path):
    server = FirecrestDouble(tmp_path / "hpc", client_secret=SECRET).start()
    yield server
    server.reap()
    server.stop()


def token(double, field="access_token"):
    """``field`` of the token endpoint's answer to the service client."""
    answer = requests.post(
        double.token_uri,
        data={"grant_type": "client_credentials", "client_id": double.client_id, "client_secret": SECRET},
        timeout=5,
    )
    return answer.json()[field]


def call(double, method, endpoint, bearer=None, **kwargs):
    """A request with ``bearer``, else a fresh token of the service client."""
    headers = {"Authorization": f"Bearer {bearer or token(double)}"}
    return requests.request(method, f"{double.url}{endpoint}", headers=headers, timeout=5, **kwargs)


def get(double, endpoint, bearer=None, **params):
    return call(double, "GET", endpoint, bearer, params=params)


def test_double_tail_is_tail_bytes_plus_n_one_based_and_zero_bytes_returns_the_last_ten_lines(double):
    path = double.fs_root / "out"
    path.write_bytes(b"abcdefghij")
    answer = get(double, "/filesystem/cluster/ops/tail", path=str(path), bytes=1, skipHeading="true")
    assert answer.json()["output"] == "abcdefghij"  # +1 is the whole file
    answer = get(double, "/filesystem/cluster/ops/tail", path=str(path), bytes=6, skipHeading="true")
    assert answer.json()["output"] == "fghij"  # +6 starts at the 6th byte
    path.write_text("".join(f"line {i}\n" for i in range(30)))
    answer = get(double, "/filesystem/cluster/ops/tail", path=str(path), bytes=0, skipHeading="true")
    assert answer.json()["output"] == "".join(f"line {i}\n" for i in range(20, 30))


def test_double_refuses_a_token_with_less_than_30_seconds_left(double):
    """Of a lifetime of ``token_ttl`` seconds."""
    double.token_ttl = 45
    assert token(double, "expires_in") == 45
    value = token(double)
    double.expire_tokens_in(20)
    answer = get(double, "/status/systems", bearer=value)
    assert answer.status_code == 401 and "expires too soon" in answer.json()["message"]


def submit(double, script="#!/bin/bash\n#SBATCH --job-name=case\nsleep 30\n"):
    work = double.fs_root / "w"
    work.mkdir(exist_ok=True)
    job = {"working_directory": str(work), "script": script}
    answer = call(double, "POST", "/compute/cluster/jobs", json={"job": job})
    assert answer.status_code == 201
    return answer.json()["jobId"]


def test_double_shows_a_running_job_as_its_allocation_record(double):
    double.allocation_records = 1
    job_id = submit(double)
    record = get(double, f"/compute/cluster/jobs/{job_id}").json()["jobs"][0]
    assert record["name"] == "allocation" and record["status"]["state"] == "PENDING"
    record = get(double, f"/compute/cluster/jobs/{job_id}").json()["jobs"][0]
    assert record["name"] == "case" and record["status"]["state"] == "RUNNING"


def test_double_hides_a_just_finished_job_from_the_listing(double):
    double.missing_after_end = 1
    job_id = submit(double, "#!/bin/bash\n#SBATCH --job-name=case\ntrue\n")
    job = double.jobs[int(job_id)]
    job.proc.wait(10)
    assert get(double, "/compute/cluster/jobs").json()["jobs"] == []
    assert [j["jobId"] for j in get(double, "/compute/cluster/jobs").json()["jobs"]] == [job_id]


def test_double_job_ids_are_strings_and_exit_code_is_zero_while_running(double):
    job_id = submit(double)
    record = get(double, f"/compute/cluster/jobs/{job_id}").json()["jobs"][0]
    assert isinstance(record["jobId"], str) and record["status"]["exitCode"] == 0


@pytest.mark.parametrize("finished", [True, False])
def test_double_cancel_of_a_finished_or_unknown_job_answers_500_with_scancels_message(double, finished):
    if finished:
        job_id = submit(double, "#!/bin/bash\n#SBATCH --job-name=case\ntrue\n")
        double.jobs[int(job_id)].proc.wait(10)
    else:
        job_id = "99999"
    answer = call(double, "DELETE", f"/compute/cluster/jobs/{job_id}")
    assert answer.status_code == 500
    assert ("already completing or complete" if finished else "Invalid job id") in answer.json()["message"]


def test_double_listing_sizes_are_strings_with_one_second_mtimes(double):
    (double.fs_root / "f").write_text("12 bytes ok\n")
    entry = get(double, "/filesystem/cluster/ops/ls", path=str(double.fs_root)).json()["output"][0]
    assert entry["size"] == "12"
    time.strptime(entry["lastModified"], "%Y-%m-%dT%H:%M:%S")


def test_double_services_health_is_a_list_with_each_service(double):
    double.unhealthy = {"ssh": "connection refused"}
    health = get(double, "/status/systems").json()["systems"][0]["servicesHealth"]
    assert [(h["serviceType"], h["healthy"]) for h in health] == [
        ("scheduler", True),
        ("ssh", False),
        ("filesystem", True),
    ]


def test_double_without_staging_answers_500_to_uploads_over_one_mib(double):
    double.staging = False
    upload = {"path": str(double.fs_root / "big"), "transfer_directives": {"file_size": 2 << 20}}
    answer = call(double, "POST", "/filesystem/cluster/transfer/upload", json=upload)
    assert answer.status_code == 500


def test_double_drop_fault_carries_the_request_out_and_closes_the_connection(double):
    double.fault("/compute/cluster/jobs$", method="POST", after=True, drop=True)
    with pytest.raises(requests.ConnectionError):
        submit(double)
    assert len(double.user_jobs()) == 1


# -- per-user tokens, as a Keycloak public client with PKCE gets them --------------------------------
def login(double, name, verifier="v" * 64):
    """The authorization code flow by hand: (token endpoint's answer, its JSON)."""
    import base64
    import hashlib
    from urllib.parse import parse_qs, urlsplit

    double.add_user(name)
    double.login_as = name
    challenge = base64.urlsafe_b64encode(hashlib.sha256(("v" * 64).encode()).digest()).rstrip(b"=").decode()
    redirect = "http://gridgate.test/connections/callback/"
    answer = requests.get(
        double.authorization_uri,
        params={
            "response_type": "code", "client_id": double.public_client_id, "redirect_uri": redirect,
            "scope": "openid offline_access", "state": "s", "code_challenge": challenge,
            "code_challenge_method": "S256",
        },
        allow_redirects=False,
        timeout=5,
    )  # fmt: skip
    code = parse_qs(urlsplit(answer.headers["Location"]).query)["code"][0]
    data = {
        "grant_type": "authorization_code", "client_id": double.public_client_id, "code": code,
        "redirect_uri": redirect, "code_verifier": verifier,
    }  # fmt: skip
    answer = requests.post(double.token_uri, data=data, timeout=5)
    return answer, answer.json()


def test_double_code_exchange_needs_the_verifier_of_the_challenge(double):
    refused, body = login(double, "ada", verifier="w" * 64)
    assert refused.status_code == 400 and body["error"] == "invalid_grant"
    answer, body = login(double, "ada")
    assert answer.status_code == 200 and body["refresh_token"] and body["id_token"]


def test_double_rotates_refresh_tokens_and_a_reuse_ends_the_session(double):
    _answer, body = login(double, "ada")
    first = body["refresh_token"]

    def refresh(value):
        data = {"grant_type": "refresh_token", "client_id": double.public_client_id, "refresh_token": value}
        return requests.post(double.token_uri, data=data, timeout=5)

    second = refresh(first).json()["refresh_token"]
    assert second != first
    reuse = refresh(first)
    assert reuse.status_code == 400 and reuse.json()["error"] == "invalid_grant"
    assert refresh(second).json()["error"] == "invalid_grant"  # the whole session ended with the reuse


def test_double_revoking_a_user_refuses_their_refresh_and_access_tokens(double):
    _answer, body = login(double, "ada")
    double.revoke_user("ada")
    data = {"grant_type": "refresh_token", "client_id": double.public_client_id, "refresh_token": body["refresh_token"]}
    assert requests.post(double.token_uri, data=data, timeout=5).json()["error"] == "invalid_grant"
    assert get(double, "/status/systems", bearer=body["access_token"]).status_code == 401


def test_double_refuses_and_records_a_call_about_a_case_under_another_subject(double):
    """The owner check: a call naming a case with the service account's token (or another user's)
    is refused and recorded, so a test using the double fails on it."""
    _answer, body = login(double, "ada")
    double.expect_owner("case-1", "ada")
    service = get(double, "/compute/cluster/jobs", name="case-1")
    assert service.status_code == 403 and "case-1" in double.violations[0]
    mine = get(double, "/compute/cluster/jobs", bearer=body["access_token"], name="case-1")
    assert mine.status_code == 200 and len(double.violations) == 1
    double.violations.clear()  # this test made the violation on purpose
