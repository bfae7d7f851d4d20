"""SPEC §9: QRMI acquire, release and job submission cost at most 4 SQL statements with real MUNGE
credentials, and a job route looks the caller's Unix account up once."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.qrmi.models import UnixAccount
from apps.sessions.models import Session, SessionStatus
from tests.qrmi.conftest import USER_UID

pytestmark = [pytest.mark.munge, pytest.mark.django_db(transaction=True)]

BASE = "/qrmi/fresnel"
BUDGET = 4


def test_qrmi_acquire_runs_at_most_four_statements(qrmi, qpu, alice, statement_budget):
    """The service uid's account is never looked up; the user's account, the pool's default
    class + access with the same-job lookup (R-SESS-2), then the usage row's lock and the
    insert-if-it-fits (R-SESS-1) in one statement on PostgreSQL (two on SQLite). A repeat of the
    same scheduler job returns its session in as many."""
    client = qrmi(0)
    body = {"user_id": str(USER_UID), "slurm_job_id": "99"}
    for _ in range(2):
        with statement_budget(3 if connection.vendor == "postgresql" else BUDGET):
            response = client.post(f"{BASE}/sessions", body, format="json")
        assert response.status_code == 200, response.content
    assert Session.objects.get(pk=response.data["id"]).user == alice


@pytest.mark.parametrize("route", ["path", "header"])
def test_qrmi_release_runs_at_most_four_statements(qrmi, open_qrmi_session, route, statement_budget):
    """On PostgreSQL the release statement (the session ends, its pool's usage gives its slots
    back, and the answer is its returned row: no lookup of the owner's uid) and the scheduling
    app's probe for jobs to cancel."""
    session = open_qrmi_session("100")
    client = qrmi(0)
    with statement_budget(2 if connection.vendor == "postgresql" else BUDGET):
        if route == "path":
            response = client.delete(f"{BASE}/sessions/{session.pk}")
        else:
            response = client.delete(f"{BASE}/sessions", HTTP_X_WARDEN_SESSION=str(session.pk))
    assert response.status_code == 200, response.content
    session.refresh_from_db()
    assert session.status == SessionStatus.REVOKED


def test_qrmi_job_submission_runs_at_most_four_statements(qrmi, qpu, open_qrmi_session, statement_budget, settings):
    """The uid's account, the session (pool and the pool's devices for the sequence check
    joined), and one statement that renews the session and inserts the job on PostgreSQL (3 of
    the 4), or the renewal and the insert on SQLite (4). The dispatcher is awake (a device is
    busy), so no wake-up is sent."""
    from apps.scheduling.models import PoolQueue
    from tests.scheduling.pulser_sequences import analog_sequence

    settings.GRIDGATE_TASKS_EAGER = False
    session = open_qrmi_session()
    PoolQueue.objects.update_or_create(pool=qpu, defaults={"awaiting_work": False})
    body = {"sequence": analog_sequence(), "shots": 10}
    for _ in range(2):
        with statement_budget(3 if connection.vendor == "postgresql" else 4):
            response = qrmi(USER_UID).post(f"{BASE}/jobs", body, format="json", HTTP_X_WARDEN_SESSION=str(session.pk))
        assert response.status_code == 200, response.content
        assert response.data["status"] == "PENDING"


@pytest.mark.postgres
def test_qrmi_jobs_into_a_session_submitted_into_before_cost_two_statements(
    qrmi, qpu, open_qrmi_session, statement_budget, settings
):
    """The uid's account and the insert: the session, its pool and devices come from the web
    process's memory (known_session), checked by the insert itself. Renamed since, the pool's
    old name is not found, as without memory."""
    from apps.resources.models import ResourcePool
    from apps.scheduling.models import Job, PoolQueue
    from tests.scheduling.pulser_sequences import analog_sequence

    settings.GRIDGATE_TASKS_EAGER = False
    session = open_qrmi_session()
    PoolQueue.objects.update_or_create(pool=qpu, defaults={"awaiting_work": False})
    body = {"sequence": analog_sequence(), "shots": 10}
    assert (
        qrmi(USER_UID).post(f"{BASE}/jobs", body, format="json", HTTP_X_WARDEN_SESSION=str(session.pk)).status_code
        == 200
    )
    with statement_budget(2):
        response = qrmi(USER_UID).post(f"{BASE}/jobs", body, format="json", HTTP_X_WARDEN_SESSION=str(session.pk))
    assert response.status_code == 200, response.content
    ResourcePool.objects.filter(pk=qpu.pk).update(name="fresnel-2")
    response = qrmi(USER_UID).post(f"{BASE}/jobs", body, format="json", HTTP_X_WARDEN_SESSION=str(session.pk))
    assert response.status_code == 404, response.content
    assert Job.objects.count() == 2


def test_qrmi_job_route_looks_the_uid_account_up_once(qrmi, open_qrmi_session):
    """R-QRMI-2: the credential's uid is mapped to its user by one lookup per request."""
    session = open_qrmi_session()
    table = UnixAccount._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        response = qrmi(USER_UID).get(f"{BASE}/jobs/12345", HTTP_X_WARDEN_SESSION=str(session.pk))
    assert response.status_code == 404
    assert sum(table in q["sql"] for q in queries.captured_queries) == 1


@pytest.mark.postgres
def test_qrmi_acquire_with_a_job_id_submission_and_release_cost_the_same_whatever_the_history(
    qrmi, qpu, alice, settings
):
    """Cost independent of history (tests/plans.py), over thousands of ended sessions and
    finished jobs: what Slurm's prolog and epilog and the
    user's tasks send, each statement served by an index in its generic plan."""
    from apps.scheduling.models import PoolQueue
    from tests.plans import assert_history_free, fill_history, sent_statements
    from tests.scheduling.pulser_sequences import analog_sequence

    settings.GRIDGATE_TASKS_EAGER = False
    fill_history(alice, qpu)
    PoolQueue.objects.update_or_create(pool=qpu, defaults={"awaiting_work": False})
    answers, sent = [], []
    acquire = {"user_id": str(USER_UID), "slurm_job_id": "77"}
    sent += sent_statements(lambda: answers.append(qrmi(0).post(f"{BASE}/sessions", acquire, format="json")))
    session_id = answers[-1].json()["id"]
    task = {"sequence": analog_sequence(), "shots": 10}
    sent += sent_statements(
        lambda: answers.append(
            qrmi(USER_UID).post(f"{BASE}/jobs", task, format="json", HTTP_X_WARDEN_SESSION=session_id)
        )
    )
    sent += sent_statements(lambda: answers.append(qrmi(0).delete(f"{BASE}/sessions/{session_id}")))
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert_history_free(sent)
