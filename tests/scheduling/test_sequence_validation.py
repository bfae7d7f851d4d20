"""R-DEV-1: what a client sends is refused at submission with a 400 that says why, for every
driver (here the emulator through the REST API; the QPU drivers in test_pasqal_*.py, QRMI in
tests/qrmi). Nothing becomes a 500 or a job that fails later on the device."""

import json

import pytest

from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device, Job
from tests.scheduling.pulser_sequences import analog_sequence, custom_sequence

pytestmark = pytest.mark.django_db


@pytest.fixture
def emulator_pool(qpu_pool):
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"max_atoms": 10})
    return qpu_pool


def post(api, owner, session, sequence, shots=10):
    return api(owner).post(
        f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {"sequence": sequence}, "shots": shots}, format="json"
    )


def refusal(response) -> str:
    assert response.status_code == 400, response.content
    return " ".join(response.json()["payload"])


def test_r_dev_1_unmeasured_sequence_is_400_not_500(api, owner, emulator_pool, open_session):
    text = refusal(post(api, owner, open_session(emulator_pool, owner), custom_sequence(measured=False)))
    assert "no measurement" in text and not Job.objects.exists()


def test_r_dev_1_parametrized_unbuilt_sequence_is_400(api, owner, emulator_pool, open_session):
    text = refusal(post(api, owner, open_session(emulator_pool, owner), custom_sequence(parametrized=True)))
    assert "parametrized" in text and "omega" in text


def test_r_dev_1_too_many_atoms_is_400(api, owner, emulator_pool, open_session):
    text = refusal(post(api, owner, open_session(emulator_pool, owner), custom_sequence(rows=3, columns=4)))
    assert "12 atoms" in text and "at most 10" in text


def test_r_dev_1_sequence_longer_than_the_device_allows_is_400(api, owner, emulator_pool, open_session):
    text = refusal(
        post(
            api, owner, open_session(emulator_pool, owner), custom_sequence(duration=7000, max_sequence_duration=10_000)
        )
    )
    assert "7000 ns" in text and "6000 ns" in text


def test_r_dev_1_shots_above_the_devices_max_runs_is_400(api, owner, emulator_pool, open_session):
    text = refusal(post(api, owner, open_session(emulator_pool, owner), analog_sequence(), shots=100_000))
    assert "100000 shots" in text and "at most 2000" in text


def test_r_dev_1_embedded_specs_cannot_raise_the_devices_limits(api, owner, emulator_pool, open_session):
    """The abstract representation carries its own copy of the device: a forged 'AnalogDevice'
    with a larger radius must not get past the real one."""
    forged = json.loads(custom_sequence(rows=1, columns=2))
    forged["device"]["max_radial_distance"] = 500
    forged["register"] = [{"name": "q0", "x": -100.0, "y": 0.0}, {"name": "q1", "x": 100.0, "y": 0.0}]
    text = refusal(post(api, owner, open_session(emulator_pool, owner), json.dumps(forged)))
    assert "does not fit" in text


def test_r_dev_1_not_a_sequence_is_400(api, owner, emulator_pool, open_session):
    assert "Not a valid Pulser sequence" in refusal(post(api, owner, open_session(emulator_pool, owner), "{not json"))


def test_r_dev_1_a_pool_with_no_device_refuses_jobs(api, owner, open_session, db):
    pool = ResourcePool.objects.create(name="empty", kind="local", public=True)
    ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    text = refusal(post(api, owner, open_session(pool, owner), analog_sequence()))
    assert "no device" in text and not Job.objects.exists()


def test_r_dev_1_a_valid_sequence_is_accepted(api, owner, emulator_pool, open_session):
    response = post(api, owner, open_session(emulator_pool, owner), analog_sequence(), shots=2000)
    assert response.status_code == 201
