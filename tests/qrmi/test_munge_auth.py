"""R-QRMI-2: MUNGE credentials verified once per request with the real munged."""

import subprocess
import time

import pytest

from apps.qrmi import munge

pytestmark = [pytest.mark.munge, pytest.mark.django_db]

SLOTS = "/qrmi/fresnel/status"  # any route that needs a credential; a service uid may read it


def test_r_qrmi_2_valid_credential_identifies_the_calling_uid(cred):
    identity = munge.decode(cred(0))
    assert (identity.uid, identity.gid) == (0, 0)
    assert identity.is_service


def test_r_qrmi_2_credential_of_a_user_carries_that_uid(cred):
    identity = munge.decode(cred(65534))
    assert identity.uid == 65534
    assert not identity.is_service


def test_r_qrmi_2_missing_credential_is_401(qpu, qrmi):
    response = qrmi(None).get(SLOTS)
    assert response.status_code == 401
    assert "Munge" in response["WWW-Authenticate"]


@pytest.mark.parametrize("garbage", ["MUNGE:AwQFAAAAAAAAAAAAAA:", "not a credential", "MUNGE:" + "A" * 5000])
def test_r_qrmi_2_forged_credential_is_401(qpu, qrmi, garbage):
    response = qrmi(None).get(SLOTS, HTTP_X_MUNGE_CRED=garbage)
    assert response.status_code == 401
    assert "MUNGE credential rejected" in response.json()["detail"]


def test_r_qrmi_2_replayed_credential_is_401(qpu, qrmi, cred):
    credential = cred(0)
    first = qrmi(None).get(SLOTS, HTTP_X_MUNGE_CRED=credential)
    assert first.status_code == 200
    replay = qrmi(None).get(SLOTS, HTTP_X_MUNGE_CRED=credential)
    assert replay.status_code == 401
    assert "replayed" in replay.json()["detail"]


def test_r_qrmi_2_credential_decoded_elsewhere_first_is_a_replay(qpu, qrmi, cred):
    credential = cred(0)
    subprocess.run(["unmunge"], input=credential, capture_output=True, text=True, check=True)
    assert qrmi(None).get(SLOTS, HTTP_X_MUNGE_CRED=credential).status_code == 401


def test_r_qrmi_2_expired_credential_is_401(qpu, qrmi, cred):
    credential = cred(0, ttl=1)
    time.sleep(2.2)  # munged's clock decides expiry; there is no way to fake it
    response = qrmi(None).get(SLOTS, HTTP_X_MUNGE_CRED=credential)
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_r_qrmi_2_munged_unreachable_is_503_not_401(qpu, qrmi, cred, settings):
    settings.GRIDGATE_MUNGE_SOCKET = "/nonexistent/munge.socket"
    response = qrmi(None).get(SLOTS, HTTP_X_MUNGE_CRED=cred(0))
    assert response.status_code == 503


def test_r_qrmi_2_main_api_accepts_munge_for_a_linked_uid(qpu, alice, qrmi, open_qrmi_session):
    session = open_qrmi_session()
    # One request runs the token, MUNGE and session authenticators and the view: a second decode
    # of the credential would be a replay (401), so a 200 proves it was verified once.
    response = qrmi(65534).get("/api/v1/sessions/")
    assert response.status_code == 200
    assert [row["id"] for row in response.json()["results"]] == [str(session.pk)]
    assert response.json()["results"][0]["user"] == alice.username


def test_r_qrmi_2_main_api_refuses_an_unlinked_uid(qpu, qrmi):
    response = qrmi(0).get("/api/v1/sessions/")
    assert response.status_code == 401
    assert "uid 0 is not linked" in response.json()["detail"]


def test_r_qrmi_2_main_api_refuses_a_replayed_credential(qpu, alice, qrmi, cred):
    credential = cred(65534)
    assert qrmi(None).get("/api/v1/sessions/", HTTP_X_MUNGE_CRED=credential).status_code == 200
    assert qrmi(None).get("/api/v1/sessions/", HTTP_X_MUNGE_CRED=credential).status_code == 401


def test_r_qrmi_2_service_uids_come_from_the_setting(cred, settings):
    settings.GRIDGATE_MUNGE_SERVICE_UIDS = frozenset({65534})
    assert munge.decode(cred(65534)).is_service
    assert not munge.decode(cred(0)).is_service


@pytest.mark.django_db
def test_the_uid_lookup_finds_the_active_user_linked_to_it_only(django_user_model):
    """The hand-written statement of every MUNGE request (apps/qrmi/statements.py)."""
    from apps.qrmi.models import UnixAccount
    from apps.qrmi.selectors import user_for_uid

    alice = django_user_model.objects.create_user("alice", email="a@example.org")
    gone = django_user_model.objects.create_user("gone", is_active=False)
    UnixAccount.objects.create(user=alice, unix_uid=1000)
    UnixAccount.objects.create(user=gone, unix_uid=1001)
    found = user_for_uid(1000)
    for field in django_user_model._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(alice, field.attname), field.name
    assert user_for_uid(1001) is None and user_for_uid(1002) is None
