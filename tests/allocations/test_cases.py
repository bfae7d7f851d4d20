"""R-ALLOC-1 for cases: each ended case is charged cores × run time once; a launch beyond the
project's core-hours is refused with 409 and what is left."""

import pytest

from apps.allocations.models import Allocation, Charge
from apps.backends.fake import FakeBackend
from apps.cases import passes
from apps.cases import services as case_services
from apps.cases.models import Case

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fake_cases(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake", "slurm": "slurm"}
    FakeBackend.reset()
    yield
    FakeBackend.reset()


def new_case(user, pool):
    return case_services.create_case(owner=user, resource_class=pool.classes.get(), name="cavity", command="run")


def run_to_the_end(case):
    case_services.launch_case(case)
    passes.submit_pass(case_ids=[case.id])
    for _ in range(10):
        passes.poll_pass(case_ids=[case.id])
        case.refresh_from_db()
        if case.is_terminal:
            return case
    raise AssertionError(f"case still {case.status}")


def test_an_ended_case_is_charged_cores_times_run_time_once(local_pool, owner, grant):
    mine = grant(local_pool, user=owner, core_hours=10)
    case = run_to_the_end(new_case(owner, local_pool))

    charge = Charge.objects.get(case=case)
    assert charge.allocation_id == mine.pk
    assert charge.core_hours == pytest.approx(case.cores * case.execution_time / 3600)
    passes.poll_pass(case_ids=[case.id])  # nothing more to record, nothing charged again
    assert Charge.objects.filter(case=case).count() == 1
    mine.refresh_from_db()
    assert mine.used_core_hours == pytest.approx(charge.core_hours)


def test_a_case_launch_beyond_the_budget_gets_409_with_the_remaining_budget(local_pool, owner, grant, api):
    mine = grant(local_pool, user=owner, core_hours=1)
    Allocation.objects.filter(pk=mine.pk).update(used_core_hours=1.25, used_period_start=mine.starts_at)
    case = new_case(owner, local_pool)

    answer = api(owner).post(f"/api/v1/cases/{case.pk}/launch/", {}, format="json")

    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert body["allocation"] == mine.pk
    assert body["allocation_remaining"]["core_hours"] == pytest.approx(-0.25)
    assert Case.objects.get(pk=case.pk).launch_requested_at is None


def test_a_case_launch_with_core_hours_left_is_accepted(local_pool, owner, grant, api):
    grant(local_pool, user=owner, core_hours=1)
    case = new_case(owner, local_pool)
    assert api(owner).post(f"/api/v1/cases/{case.pk}/launch/", {}, format="json").status_code in (200, 202)


def test_a_case_launch_with_exactly_no_core_hours_left_gets_409(local_pool, owner, grant, api):
    mine = grant(local_pool, user=owner, core_hours=1)
    Allocation.objects.filter(pk=mine.pk).update(used_core_hours=1, used_period_start=mine.starts_at)
    case = new_case(owner, local_pool)
    answer = api(owner).post(f"/api/v1/cases/{case.pk}/launch/", {}, format="json")
    assert answer.status_code == 409, answer.content
    assert answer.json()["allocation_remaining"]["core_hours"] == 0


def test_a_case_launch_after_the_grant_ended_gets_409(local_pool, owner, grant, api):
    from datetime import timedelta

    from django.utils import timezone

    start = timezone.now() - timedelta(days=30)
    grant(local_pool, user=owner, core_hours=100, starts_at=start, ends_at=start + timedelta(days=29))
    case = new_case(owner, local_pool)
    answer = api(owner).post(f"/api/v1/cases/{case.pk}/launch/", {}, format="json")
    assert answer.status_code == 409, answer.content


def test_cases_ended_in_one_pass_are_charged_each_to_its_owners_project_on_its_own_pool(local_pool, qpu, owner, grant):
    on_qpu = grant(qpu, name="qpu time", user=owner, core_hours=10)
    on_local = grant(local_pool, name="cluster time", user=owner, core_hours=10)
    cases = [new_case(owner, local_pool), new_case(owner, qpu)]
    for case in cases:
        case_services.launch_case(case)
    ids = [case.id for case in cases]
    passes.submit_pass(case_ids=ids)
    for _ in range(10):
        passes.poll_pass(case_ids=ids)
        if all(case.is_terminal for case in Case.objects.filter(id__in=ids)):
            break
    charged = dict(Charge.objects.values_list("case_id", "allocation_id"))
    assert charged == {cases[0].id: on_local.pk, cases[1].id: on_qpu.pk}


def test_a_case_is_charged_to_its_owners_grant_in_its_period_their_own_before_their_groups(local_pool, owner, grant):
    from datetime import timedelta

    from django.contrib.auth.models import Group
    from django.utils import timezone

    lab = Group.objects.create(name="lab")
    lab.user_set.add(owner)
    ended = timezone.now() - timedelta(days=30)
    grant(local_pool, name="last year", user=owner, core_hours=10, starts_at=ended, ends_at=ended + timedelta(days=1))
    grant(local_pool, name="lab's", group=lab, core_hours=10)
    own = grant(local_pool, name="own", user=owner, core_hours=10)
    case = run_to_the_end(new_case(owner, local_pool))
    assert Charge.objects.get(case=case).allocation_id == own.pk
