"""R-QRMI-2: the Unix uid is edited as an inline on the user's admin page."""

import pytest
from django.contrib.auth import get_user_model

from apps.cases import services as case_services
from apps.cases.models import Case, CaseStatus
from apps.qrmi.models import UnixAccount
from apps.scheduling.models import Job
from apps.sessions.models import Session
from tests import factories
from tests.qrmi.test_qrmi_api import acquire, submit

pytestmark = pytest.mark.django_db

User = get_user_model()


def user_form(user, uid, total=0):
    return {
        "username": user.username,
        "is_active": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "unix_account-TOTAL_FORMS": "1",
        "unix_account-INITIAL_FORMS": str(total),
        "unix_account-MIN_NUM_FORMS": "0",
        "unix_account-MAX_NUM_FORMS": "1",
        "unix_account-0-unix_uid": str(uid),
        "unix_account-0-user": str(user.pk),
        **({"unix_account-0-id": str(user.unix_account.pk)} if total else {}),
        # The identities inline on the same page (docs/identity.md), left empty.
        "identities-TOTAL_FORMS": "0",
        "identities-INITIAL_FORMS": "0",
        "identities-MIN_NUM_FORMS": "0",
        "identities-MAX_NUM_FORMS": "1000",
    }


def test_r_qrmi_2_user_admin_shows_and_saves_the_unix_uid(admin_client, owner):
    page = admin_client.get(f"/admin/auth/user/{owner.pk}/change/")
    assert page.status_code == 200
    assert b"unix_account-0-unix_uid" in page.content
    response = admin_client.post(f"/admin/auth/user/{owner.pk}/change/", user_form(owner, 1000))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert UnixAccount.objects.get(user=owner).unix_uid == 1000


def test_r_qrmi_2_a_uid_belongs_to_one_user(admin_client, owner, member):
    UnixAccount.objects.create(user=member, unix_uid=1000)
    response = admin_client.post(f"/admin/auth/user/{owner.pk}/change/", user_form(owner, 1000))
    assert response.status_code == 200
    assert b"Unix account with this Unix uid already exists" in response.content
    assert not UnixAccount.objects.filter(user=owner).exists()


def test_r_qrmi_2_user_changelist_shows_and_searches_uids(admin_client, owner, member):
    UnixAccount.objects.create(user=owner, unix_uid=4321)
    page = admin_client.get("/admin/auth/user/", {"q": "4321"})
    assert page.status_code == 200
    assert page.context["cl"].result_count == 1
    assert b"4321" in page.content


def test_unix_account_admin_lists(admin_client, owner):
    UnixAccount.objects.create(user=owner, unix_uid=4321)
    assert admin_client.get("/admin/qrmi/unixaccount/").status_code == 200


def running_case(owner, pool):
    case = case_services.create_case(owner=owner, resource_class=pool.classes.get(), name="cavity", command="x")
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.RUNNING)
    return case


def test_r_case_8_a_uid_does_not_change_while_its_users_cases_run_under_it(admin_client, owner, local_pool):
    UnixAccount.objects.create(user=owner, unix_uid=4321)
    case = running_case(owner, local_pool)
    page = f"/admin/auth/user/{owner.pk}/change/"

    refused = admin_client.post(page, user_form(owner, 4322, total=1))

    assert refused.status_code == 200
    assert "1 case(s) of owner run under this uid" in refused.content.decode()
    assert UnixAccount.objects.get(user=owner).unix_uid == 4321
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.DONE, results_fetched=True)
    assert admin_client.post(page, user_form(owner, 4322, total=1)).status_code == 302
    assert UnixAccount.objects.get(user=owner).unix_uid == 4322


def test_r_case_8_a_uid_is_not_unlinked_while_its_users_cases_run_under_it(admin_client, owner, local_pool):
    account = UnixAccount.objects.create(user=owner, unix_uid=4321)
    running_case(owner, local_pool)

    inline = admin_client.post(
        f"/admin/auth/user/{owner.pk}/change/", {**user_form(owner, 4321, total=1), "unix_account-0-DELETE": "on"}
    )
    page = admin_client.post(f"/admin/qrmi/unixaccount/{account.pk}/delete/", {"post": "yes"}, follow=True)

    assert inline.status_code == 200
    assert "run under this uid" in inline.content.decode()
    assert "Not deleted: 1 case(s) of owner run under this uid" in page.content.decode()
    assert UnixAccount.objects.filter(pk=account.pk, unix_uid=4321).exists()


def test_a_uid_changes_while_cases_run_only_elsewhere_than_under_it(admin_client, owner, local_pool):
    UnixAccount.objects.create(user=owner, unix_uid=4321)
    trusted = factories.pool("trusted-local", trusted=True, public=False)
    trusted.users.add(owner)
    running_case(owner, trusted)  # runs as the sandbox account, not the owner's

    assert admin_client.post(f"/admin/auth/user/{owner.pk}/change/", user_form(owner, 4322, total=1)).status_code == 302
    assert UnixAccount.objects.get(user=owner).unix_uid == 4322


@pytest.mark.munge
def test_r_qrmi_3_qrmi_sessions_and_jobs_show_in_the_admin(admin_client, qpu, qrmi, alice):

    session = Session.objects.get(pk=acquire(qrmi, slurm_job_id="31").json()["id"])
    job_id = submit(qrmi, session).json()["id"]
    sessions = admin_client.get("/admin/compute_sessions/session/", {"q": "31"})
    assert [s.pk for s in sessions.context["cl"].result_list] == [session.pk]
    jobs = admin_client.get("/admin/scheduling/job/")
    assert [j.pk for j in jobs.context["cl"].result_list] == [job_id]
    assert Job.objects.get(pk=job_id).user == alice
