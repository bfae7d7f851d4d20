"""Pulser's own remote-backend API on Gridgate: ``QPUBackend(seq, connection=GridgateConnection(...))``
against the live server's emulator, as a Pulser user runs it against Pasqal Cloud or QRMI."""

import pulser.devices
import pytest
from gridgate_client.pulser import GridgateConnection
from pulser import Pulse, QPUBackend, Sequence
from pulser.backend.remote import BatchStatus

from apps.accounts.services import issue_token
from apps.scheduling.models import Job, JobStatus
from apps.sessions.models import RevocationReason, Session, SessionStatus

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def bell_like() -> Sequence:
    device = pulser.devices.AnalogDevice  # what the pool's emulator announces in its specs
    register = device.pre_calibrated_layouts[0].define_register(0, 1, qubit_ids=["q0", "q1"])
    sequence = Sequence(register, device)
    sequence.declare_channel("rydberg", "rydberg_global")
    sequence.add(Pulse.ConstantPulse(500, 2.0, 0.0, 0.0), "rydberg")
    sequence.measure("ground-rydberg")
    return sequence


@pytest.fixture
def connection(site, worker, alice, pools):
    connection = GridgateConnection(site.url, issue_token(alice)[1], pool="qpu")
    yield connection
    connection.close()  # keep-alive connections hold a live-server thread (and its database connection)


def test_qpu_backend_run_returns_counts_and_releases_its_session(connection, alice):
    assert set(connection.fetch_available_devices()) == {"emulator"}
    assert connection.supports_open_batch()

    results = QPUBackend(bell_like(), connection=connection).run(job_params=[{"runs": 500}], wait=True)

    counts = results[0].final_bitstrings
    assert sum(counts.values()) == 500 and all(len(bits) == 2 for bits in counts)
    session = Session.objects.get(pk=results.batch_id)
    assert (session.user, session.status, session.revocation_reason) == (
        alice,
        SessionStatus.REVOKED,
        RevocationReason.RELEASED,
    )
    assert results.get_batch_status() == BatchStatus.DONE
    job = Job.objects.get(session=session)
    assert str(job.pk) == results.job_ids[0] and job.status == JobStatus.COMPLETED


def test_an_open_batch_is_one_session_released_when_the_batch_ends(connection):
    backend = QPUBackend(bell_like(), connection=connection)
    with backend.open_batch():
        first = backend.run(job_params=[{"runs": 100}], wait=True)
        second = backend.run(job_params=[{"runs": 50}, {"runs": 20}], wait=True)
        session = Session.objects.get(pk=first.batch_id)
        assert second.batch_id == first.batch_id and session.status == SessionStatus.ACTIVE

    session.refresh_from_db()
    assert session.status == SessionStatus.REVOKED
    assert [sum(r.final_bitstrings.values()) for r in second] == [50, 20]
    assert sorted(Job.objects.filter(session=session).values_list("shots", flat=True)) == [20, 50, 100]


def test_results_read_from_another_connection_come_from_the_jobs_payload(connection, site, alice):
    results = QPUBackend(bell_like(), connection=connection).run(job_params=[{"runs": 30}], wait=True)

    elsewhere = GridgateConnection(site.url, issue_token(alice)[1], pool="qpu")
    again = elsewhere._fetch_result(results.batch_id, None)
    elsewhere.close()

    assert again[0].final_bitstrings == results[0].final_bitstrings
    assert again[0].atom_order == ("q0", "q1")
