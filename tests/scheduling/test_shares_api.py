"""R-SCHED-6 and R-JOB-5 where users and operators see them: the shares endpoint, a session's
next job, the job API's codes and ETA, the session page and the admin."""

import re

import pytest
from rest_framework.test import APIClient

from apps.resources.models import ResourcePool
from apps.scheduling.models import DeviceRuntime, FairShare
from tests.scheduling.test_strategies import dispatch_and_finish, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def usage_pool(qpu_pool):
    qpu_pool.strategy = "usage_fair"
    qpu_pool.save()
    return qpu_pool


def api(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_user_sees_only_the_share_they_count_under(usage_pool, fake_device, open_session, owner, member):
    submit(open_session(usage_pool, owner), 2)
    submit(open_session(usage_pool, member), 2)
    dispatch_and_finish(usage_pool, runtime=30.0)  # owner's (the tie goes to the older user)
    body = api(member).get(f"/api/v1/resource-pools/{usage_pool.pk}/shares/").json()
    assert [(s["principal"], s["name"]) for s in body] == [("user", "member")]
    assert body[0]["usage_seconds"] == 0 and body[0]["position"] == 1 and body[0]["waiting_shares"] == 2
    assert body[0]["entitled_share"] == pytest.approx(0.5)


def test_staff_see_every_share_with_its_decayed_usage(usage_pool, fake_device, open_session, owner, member, staff):
    submit(open_session(usage_pool, owner), 2)
    submit(open_session(usage_pool, member), 1)
    dispatch_and_finish(usage_pool, runtime=30.0)
    body = api(staff).get(f"/api/v1/resource-pools/{usage_pool.pk}/shares/").json()
    by_name = {s["name"]: s for s in body}
    assert by_name["owner"]["usage_seconds"] == pytest.approx(30.0, rel=1e-3)
    assert by_name["owner"]["usage_share"] == pytest.approx(1.0)
    assert by_name["member"]["position"] == 1 and by_name["owner"]["position"] == 2
    assert "staff" not in by_name


def test_a_user_who_never_ran_sees_a_share_of_weight_one_and_nothing_used(usage_pool, owner):
    body = api(owner).get(f"/api/v1/resource-pools/{usage_pool.pk}/shares/").json()
    assert body == [
        {
            "principal": "user",
            "name": "owner",
            "weight": 1.0,
            "usage_seconds": 0.0,
            "entitled_share": 0.0,
            "usage_share": 0.0,
            "position": None,
            "waiting_shares": 0,
            "pending_jobs": 0,
            "running_jobs": 0,
        }
    ]
    assert not FairShare.objects.exists()  # reading creates nothing


def test_other_strategies_have_no_shares_and_hidden_pools_do_not_exist(qpu_pool, owner):
    assert api(owner).get(f"/api/v1/resource-pools/{qpu_pool.pk}/shares/").json() == []
    hidden = ResourcePool.objects.create(name="hidden", kind="local", strategy="usage_fair")
    assert api(owner).get(f"/api/v1/resource-pools/{hidden.pk}/shares/").status_code == 404


def test_a_waiting_sessions_next_job_is_in_the_session_api(qpu_pool, fake_device, open_session, owner, member):
    DeviceRuntime.objects.create(device=fake_device, band=1, count=10, mean=40.0, var=0.0)
    ahead, waiting = open_session(qpu_pool, owner), open_session(qpu_pool, member)
    submit(ahead, 2)
    (job,) = submit(waiting, 1)
    body = api(member).get(f"/api/v1/sessions/{waiting.pk}/").json()
    assert body["next_job"]["job"] == job.pk
    assert body["next_job"]["pending_code"] == "waiting_turn"
    assert body["next_job"]["eta_seconds"] == pytest.approx(40.0, abs=1.0)
    listed = api(owner).get("/api/v1/sessions/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert rows[0]["next_job"]["queue_position"] == 1
    idle = open_session(qpu_pool, owner, external_id="idle")
    assert api(owner).get(f"/api/v1/sessions/{idle.pk}/").json()["next_job"] is None


def test_the_job_api_gives_the_code_and_the_eta(qpu_pool, fake_device, open_session, owner):
    DeviceRuntime.objects.create(device=fake_device, band=1, count=10, mean=25.0, var=9.0)
    jobs = submit(open_session(qpu_pool, owner), 2)
    body = api(owner).get(f"/api/v1/jobs/{jobs[1].pk}/").json()
    assert body["pending_code"] == "waiting_turn" and body["queue_position"] == 2
    assert body["eta_seconds"] == pytest.approx(25.0, abs=1.0)
    assert body["eta_error_seconds"] == pytest.approx(3.0)


def test_the_session_page_shows_the_users_share_and_next_job(usage_pool, fake_device, open_session, owner, client):
    session = open_session(usage_pool, owner)
    submit(session, 3)
    dispatch_and_finish(usage_pool, runtime=90.0)
    client.force_login(owner)
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    assert "Your share of qpu" in page
    assert re.search(r"1 min (29|30) s \(decayed\)", page)  # 90 s, decayed by the second or so since
    assert "Next job" in page and "starts likely in about" in page


def test_operators_set_weights_and_rebuild_usage_in_the_admin(usage_pool, fake_device, open_session, owner, client):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", password="pw")
    submit(open_session(usage_pool, owner), 1)
    dispatch_and_finish(usage_pool, runtime=12.0)
    client.force_login(admin)
    assert client.get("/admin/scheduling/fairshare/").status_code == 200
    share = FairShare.objects.get(user=owner)
    FairShare.objects.filter(pk=share.pk).update(usage=0.0)
    response = client.post(
        "/admin/resources/resourcepool/",
        {"action": "recompute_usage", "_selected_action": [usage_pool.pk]},
        follow=True,
    )
    assert "usage rebuilt from 1 job(s)" in response.content.decode()
    assert FairShare.objects.get(pk=share.pk).usage == pytest.approx(12.0, rel=1e-3)


def test_operators_choose_share_by_and_the_half_life_through_the_api(usage_pool, staff):
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(Permission.objects.get(codename="change_resourcepool"))
    url = f"/api/v1/resource-pools/{usage_pool.pk}/"
    answer = api(staff).patch(url, {"share_by": "group", "usage_half_life": 7200}, format="json")
    assert answer.status_code == 200, answer.content
    assert (answer.json()["share_by"], answer.json()["usage_half_life"]) == ("group", 7200)
    refused = api(staff).patch(url, {"share_by": "everyone", "usage_half_life": 5}, format="json")
    assert refused.status_code == 400
    assert set(refused.json()) >= {"share_by", "usage_half_life"}


def test_lists_and_shares_cost_the_same_queries_whatever_the_jobs_and_users(
    usage_pool, fake_device, open_session, owner, member, outsider, staff
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.scheduling import eta

    def queries(client, url):
        eta.clear_cache()  # every read rebuilds its pools' snapshots
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        return len(ctx)

    urls = ["/api/v1/jobs/?page_size=500", "/api/v1/sessions/", f"/api/v1/resource-pools/{usage_pool.pk}/shares/"]
    submit(open_session(usage_pool, owner), 2)
    dispatch_and_finish(usage_pool)
    few = [queries(api(staff), url) for url in urls]
    for user in (owner, member, outsider):
        submit(open_session(usage_pool, user), 15)
    dispatch_and_finish(usage_pool)
    assert [queries(api(staff), url) for url in urls] == few
