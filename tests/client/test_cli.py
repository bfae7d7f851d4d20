"""The ``gridgate`` command against the live server, as a user in a terminal or a batch script uses
it: log in, sessions, the README's Pulser sequence, cases from a directory, refusals."""

import json
import stat
import tarfile
from pathlib import Path

import httpx
import pytest

from apps.accounts.services import issue_token
from apps.cases import services as case_services
from apps.cases.models import Case
from apps.scheduling.models import Device, Job
from apps.sessions.models import RevocationReason, Session, SessionStatus
from tests.client.conftest import README_SEQUENCE

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def log_in(gridgate, username="alice", password="alice-pw"):  # noqa: S107 - a test account
    done = gridgate("login", "--username", username, "--password-stdin", "--json", stdin=password + "\n")
    assert done.code == 0, done.stderr
    return done.json()


def test_login_stores_the_token_private_and_later_commands_use_it(gridgate, alice, pools):
    answer = log_in(gridgate)

    credentials = gridgate.home / ".config" / "gridgate" / "credentials.json"
    assert answer["stored"] == str(credentials)
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert stat.S_IMODE(credentials.parent.stat().st_mode) == 0o700
    assert "alice-pw" not in credentials.read_text()
    pools_seen = gridgate("pools", "--json").json()
    assert {pool["name"] for pool in pools_seen} == {"local", "qpu"}


def test_logout_revokes_the_stored_token_on_the_server_and_forgets_it(gridgate, alice, pools):
    log_in(gridgate)
    credentials = gridgate.home / ".config" / "gridgate" / "credentials.json"
    token = next(iter(json.loads(credentials.read_text())["servers"].values()))["token"]

    done = gridgate("logout", "--json")

    assert done.code == 0, done.stderr
    assert done.json()["revoked"] is True
    assert token not in credentials.read_text()
    assert gridgate("pools", env={"GRIDGATE_TOKEN": token}).code == 4  # refused by the server: revoked


def test_logout_of_a_token_stored_without_its_id_forgets_it_and_says_it_stays_valid(gridgate, alice, pools):
    log_in(gridgate)
    credentials = gridgate.home / ".config" / "gridgate" / "credentials.json"
    stored = json.loads(credentials.read_text())
    entry = next(iter(stored["servers"].values()))
    del entry["token_id"]  # as an older client kept it
    credentials.write_text(json.dumps(stored))

    done = gridgate("logout")

    assert done.code == 0, done.stderr
    assert "stays valid until it expires" in done.stdout + done.stderr
    assert gridgate("pools", env={"GRIDGATE_TOKEN": entry["token"]}).code == 0


def test_wrong_password_exits_refused_with_the_servers_words(gridgate, alice, pools):
    done = gridgate("login", "--username", "alice", "--password-stdin", stdin="nope\n")

    assert done.code == 3
    assert "Unable to log in with provided credentials." in done.stderr


def test_without_a_token_commands_say_to_log_in(gridgate, pools):
    done = gridgate("pools")

    assert done.code == 4
    assert "gridgate login" in done.stderr


def test_an_environment_token_overrides_the_stored_one(gridgate, alice, pools):
    log_in(gridgate)

    done = gridgate("pools", env={"GRIDGATE_TOKEN": "not-a-token"})

    assert done.code == 4
    assert "Invalid token" in done.stderr or "token" in done.stderr.lower()
    # Logging in again would change nothing: the environment's token wins, and the hint says so.
    assert "GRIDGATE_TOKEN" in done.stderr and "log in again" not in done.stderr


def test_session_open_prints_the_session_id_alone_on_stdout(gridgate, alice, pools):
    """As documented: SESSION=$(gridgate session open qpu) is the id, usable as --session."""
    log_in(gridgate)

    done = gridgate("session", "open", "qpu", "--slots", "2")

    assert done.code == 0, done.stderr
    assert done.stdout == f"{Session.objects.get().id}\n"
    assert done.stderr == "qpu/access: 2 slot(s)\n"


def test_session_list_names_each_sessions_pool_and_class_and_says_how_an_ended_one_ended(gridgate, alice, pools):
    log_in(gridgate)
    kept = gridgate("session", "open", "qpu").stdout.strip()
    closed = gridgate("session", "open", "qpu", "--slots", "2").stdout.strip()
    assert gridgate("session", "close", closed).code == 0

    active = gridgate("session", "list").stdout.splitlines()
    every = {line.split()[0]: line for line in gridgate("session", "list", "--all").stdout.splitlines()}

    assert active == [every[kept]] and "  qpu/access  1 slot(s)  active  expires 20" in every[kept]
    assert "  qpu/access  2 slot(s)  revoked  ended 20" in every[closed] and every[closed].endswith("(released)")


def test_session_readme_sequence_counts_cancel_and_release(gridgate, worker, alice, pools):
    log_in(gridgate)
    opened = gridgate("session", "open", "qpu", "--slots", "2", "--json").json()
    assert opened["slots"] == 2 and opened["status"] == "active"
    assert [s["id"] for s in gridgate("session", "list", "--json").json()] == [opened["id"]]

    done = gridgate(
        "job", "submit", str(README_SEQUENCE), "--session", opened["id"], "--shots", "500", "--wait", "--json"
    )
    assert done.code == 0, done.stderr
    job = done.json()
    assert job["status"] == "completed"
    result = gridgate("job", "result", str(job["id"]), "--json").json()
    assert sum(result["counts"].values()) == 500
    csv_lines = gridgate("job", "result", str(job["id"]), "--csv").stdout.splitlines()
    assert csv_lines[0] == "bitstring,count,probability"
    assert sum(int(line.split(",")[1]) for line in csv_lines[1:]) == 500

    # A finished job cannot be cancelled: refused (exit 3) with the server's reason.
    again = gridgate("job", "cancel", str(job["id"]))
    assert (again.code, again.stderr) == (3, "gridgate: Job is completed.\n")

    # With the device offline a job waits; cancelling it ends it, and waiting on it says so (6).
    Device.objects.filter(pool=pools["qpu"]).update(online=False)
    waiting = gridgate("job", "submit", str(README_SEQUENCE), "--session", opened["id"], "--json").json()
    assert waiting["status"] == "pending"
    assert gridgate("job", "cancel", str(waiting["id"]), "--json").json()["status"] == "cancelled"
    assert gridgate("job", "wait", str(waiting["id"])).code == 6

    closed = gridgate("session", "close", opened["id"], "--json").json()
    assert closed["status"] == "revoked"
    session = Session.objects.get(pk=opened["id"])
    assert (session.status, session.revocation_reason) == (SessionStatus.REVOKED, RevocationReason.RELEASED)


def test_job_submit_with_a_pool_opens_and_releases_its_own_session(gridgate, worker, alice, pools):
    log_in(gridgate)

    done = gridgate("job", "submit", str(README_SEQUENCE), "--pool", "qpu", "--shots", "100", "--wait", "--json")

    assert done.code == 0, done.stderr
    job = Job.objects.get(pk=done.json()["id"])
    assert sum(job.result["counts"].values()) == 100
    assert job.session.status == SessionStatus.REVOKED


def test_job_wait_times_out_with_exit_124(gridgate, alice, pools):
    log_in(gridgate)
    Device.objects.filter(pool=pools["qpu"]).update(online=False)
    opened = gridgate("session", "open", "qpu", "--json").json()
    job = gridgate("job", "submit", str(README_SEQUENCE), "--session", opened["id"], "--json").json()

    done = gridgate("job", "wait", str(job["id"]), "--timeout", "1", "--json")

    assert done.code == 124
    assert done.json()["body"]["status"] == "pending"


def test_case_from_a_directory_follows_its_log_and_downloads_every_file(
    gridgate, worker, alice, pools, tmp_path, link_account
):
    link_account(alice)  # R-CASE-8: the case runs as alice's own Unix account
    log_in(gridgate)
    inputs = tmp_path / "sum"
    inputs.mkdir()
    (inputs / "numbers.txt").write_text("1 2 3\n")
    command = "cat numbers.txt; awk '{print $1+$2+$3}' numbers.txt > sum.txt; echo finished"

    created = gridgate("case", "create", str(inputs), "--pool", "local", "--command", command, "--launch", "--json")
    assert created.code == 0, created.stderr
    case_id = created.json()["id"]
    assert created.json()["launch_requested_at"]

    followed = gridgate("case", "logs", case_id, "-f")
    assert followed.code == 0, followed.stderr
    assert followed.stdout == "1 2 3\nfinished\n"  # the whole log, once, to the end of the case
    assert gridgate("case", "wait", case_id, "--json").json()["status"] == "done"

    listed = {entry["path"] for entry in gridgate("case", "ls", case_id, "--json").json()}
    assert {"inputs/numbers.txt", "results/sum.txt", "stdout.log"} <= listed
    out = tmp_path / "out"
    got = gridgate("case", "get", case_id, "--all", "-o", str(out), "--json")
    assert got.code == 0, got.stderr
    assert (out / "results" / "sum.txt").read_text() == "6\n"
    assert (out / "inputs" / "numbers.txt").read_text() == "1 2 3\n"
    assert sorted(got.json()["written"]) == sorted(str(out / path) for path in listed)
    one = gridgate("case", "get", case_id, "results/sum.txt", "-o", str(tmp_path / "one"))
    assert one.code == 0 and (tmp_path / "one" / "results" / "sum.txt").read_text() == "6\n"


def test_case_archive_is_a_tar_of_the_workspace(gridgate, site, worker, alice, pools, tmp_path, link_account):
    """The archive the CLI unpacks is an ordinary .tar.gz (the page's Download all)."""
    link_account(alice)
    case = case_services.create_case(
        owner=alice, resource_class=pools["local"].classes.get(), name="t", command="echo hi > out.txt"
    )
    log_in(gridgate)
    assert gridgate("case", "launch", str(case.id), "--wait").code == 0

    response = httpx.get(
        f"{site.url}/api/v1/cases/{case.id}/archive/", headers={"Authorization": f"Token {issue_token(alice)[1]}"}
    )

    assert response.status_code == 200 and response.headers["content-type"] == "application/gzip"
    assert response.headers["content-disposition"] == f'attachment; filename="case-{case.id}.tar.gz"'
    path = tmp_path / "a.tar.gz"
    path.write_bytes(response.content)
    with tarfile.open(path) as tar:
        assert f"{case.id}/results/out.txt" in tar.getnames()
        assert tar.extractfile(f"{case.id}/results/out.txt").read() == b"hi\n"


def test_a_refused_launch_exits_non_zero_with_the_servers_reason(gridgate, alice, pools, tmp_path):
    """alice has no linked Unix account and the local pool runs each case as its owner's."""
    log_in(gridgate)
    case = case_services.create_case(
        owner=alice, resource_class=pools["local"].classes.get(), name="refused", command="true"
    )

    done = gridgate("case", "launch", str(case.id), "--json")

    assert done.code == 3
    assert "yours is not linked" in done.stderr
    assert "yours is not linked" in done.json()["error"]
    assert Case.objects.get(pk=case.id).launch_requested_at is None

    # The pool says so before anything is uploaded.
    (tmp_path / "in.txt").write_text("x")
    early = gridgate("case", "create", str(tmp_path), "--pool", "local", "--command", "true", "--launch")
    assert early.code == 3
    assert "not usable by you" in early.stderr and "yours is not linked" in early.stderr
    listed = gridgate("pools", "--json").json()
    local = next(pool for pool in listed if pool["name"] == "local")
    assert (local["usable"], local["runs"]) == (False, "cases")
    assert [pool["name"] for pool in listed] == ["qpu", "local"]  # usable first


def test_allocations_lists_what_is_left_of_your_projects(gridgate, alice, pools):
    from datetime import timedelta

    from django.utils import timezone

    from apps.allocations.models import Allocation

    start = timezone.now() - timedelta(hours=1)
    Allocation.objects.create(
        name="lattice",
        pool=pools["qpu"],
        user=alice,
        device_seconds=5 * 3600,
        starts_at=start,
        ends_at=start + timedelta(days=30),
        used_device_seconds=3.8 * 3600,
        used_period_start=start,
    )
    log_in(gridgate)
    this_client = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "client" / "src")}  # this tree's CLI
    done = gridgate("allocations", env=this_client)
    assert done.code == 0, done.stderr
    assert "lattice" in done.stdout and "device time: 1.2 h of 5.0 h left this period" in done.stdout
    rows = gridgate("allocations", "--json", env=this_client).json()
    assert rows[0]["remaining"]["device_seconds"] == pytest.approx(1.2 * 3600)
