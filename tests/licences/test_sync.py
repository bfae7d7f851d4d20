"""The licence sync's rules with Slurm's side in memory (``fake_slurm``): the count it wants, when
it syncs, coalescing, failing closed, failures and drift, the command. The same against the real
accounting cluster: test_slurm_licences.py."""

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import OperationalError

from apps.licences import passes, services
from apps.licences.models import LicenceState
from apps.resources.models import ResourcePool
from apps.scheduling.models import Device
from apps.sessions import services as sessions

pytestmark = pytest.mark.django_db


def admit(pool, user, **kwargs):
    return sessions.admit(user=user, resource_class=pool.classes.get(), **kwargs).session


@pytest.fixture
def eager(settings, django_capture_on_commit_callbacks):
    """Tasks run inline once the transaction (here, the test's) would commit."""
    settings.GRIDGATE_TASKS_EAGER = True

    def run(action):
        with django_capture_on_commit_callbacks(execute=True):
            return action()

    return run


def test_the_count_is_the_slots_that_sessions_of_no_batch_job_leave(licensed_pool, owner):
    assert passes.wanted(licensed_pool) == (2, "2 slots, 0 held by sessions of no batch job")
    admit(licensed_pool, owner, external_id="4242")  # a batch job's session: Slurm counts it already
    assert passes.wanted(licensed_pool)[0] == 2
    admit(licensed_pool, owner)  # a REST session: Slurm knows nothing of it
    assert passes.wanted(licensed_pool) == (1, "2 slots, 1 held by sessions of no batch job")


def test_a_rest_session_lowers_the_count_and_its_release_raises_it(licensed_pool, owner, fake_slurm, eager):
    licence = licensed_pool.slurm_licence
    session = eager(lambda: admit(licensed_pool, owner))
    assert fake_slurm.counts[licence] == 1
    eager(lambda: sessions.release(user=owner, session_id=session.pk))
    assert fake_slurm.counts[licence] == 2
    state = LicenceState.objects.get(pool=licensed_pool)
    assert (state.licence, state.count, state.failures, state.pending_since) == (licence, 2, 0, None)


def test_a_batch_jobs_session_changes_nothing_slurm_counts_and_syncs_nothing(
    licensed_pool, owner, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append(args))
    with django_capture_on_commit_callbacks(execute=True):
        session = admit(licensed_pool, owner, external_id="4242")
        sessions.release(user=owner, session_id=session.pk)
    assert sent == []


def test_syncs_of_one_pool_are_coalesced_while_one_is_pending(licensed_pool, owner, member, monkeypatch):
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append(args))
    admit(licensed_pool, owner)
    admit(licensed_pool, member)  # the first one's sync has not run: it will see this one too
    assert sent == [(licensed_pool.pk,)]
    assert LicenceState.objects.get(pool=licensed_pool).pending_since


def test_a_pool_without_room_for_slurm_work_closes_its_licence_and_says_why(licensed_pool, fake_slurm):
    ResourcePool.objects.filter(pk=licensed_pool.pk).update(is_accessible=False, accessibility_message="calibration")
    assert passes.sync_pool(licensed_pool.pk) == "created"
    state = LicenceState.objects.get(pool=licensed_pool)
    assert (state.count, state.reason) == (0, "the pool is offline: calibration")
    ResourcePool.objects.filter(pk=licensed_pool.pk).update(is_accessible=True)
    Device.objects.filter(pool=licensed_pool).update(online=False)
    passes.sync_pool(licensed_pool.pk)
    assert LicenceState.objects.get(pool=licensed_pool).reason == "the pool is offline: no device of the pool is online"
    Device.objects.filter(pool=licensed_pool).update(online=True)
    passes.sync_pool(licensed_pool.pk)
    assert fake_slurm.counts[licensed_pool.slurm_licence] == 2


def test_making_a_pool_inaccessible_syncs_its_licence(licensed_pool, fake_slurm, eager, api, staff):
    response = eager(
        lambda: api(staff).put(
            f"/api/v1/resource-pools/{licensed_pool.pk}/accessible/",
            {"is_accessible": False, "message": "maintenance"},
            format="json",
        )
    )
    assert response.status_code == 200
    assert fake_slurm.counts[licensed_pool.slurm_licence] == 0


def test_a_failing_sacctmgr_is_counted_and_shown_and_the_next_pass_repairs(licensed_pool, fake_slurm, client, settings):
    fake_slurm.failing = "sacctmgr show resource failed (1): slurmdbd: Connection refused"
    assert passes.reconcile() == {licensed_pool.pk: "failed"}
    assert passes.reconcile() == {licensed_pool.pk: "failed"}
    state = LicenceState.objects.get(pool=licensed_pool)
    assert state.failures == 2 and "Connection refused" in state.error and state.count is None
    settings.GRIDGATE_METRICS_TOKEN = "t" * 20
    body = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {'t' * 20}").content.decode()
    assert f'gridgate_licence_sync_failures{{pool="{licensed_pool.name}"}} 2.0' in body
    fake_slurm.failing = ""
    assert passes.reconcile() == {licensed_pool.pk: "created"}
    state.refresh_from_db()
    assert (state.failures, state.error, state.count) == (0, "", 2)


def test_a_count_changed_by_hand_in_slurm_is_repaired_by_the_reconcile_pass(licensed_pool, fake_slurm):
    passes.reconcile()
    fake_slurm.counts[licensed_pool.slurm_licence] = 7
    assert passes.reconcile() == {licensed_pool.pk: "set from 7"}
    assert fake_slurm.counts[licensed_pool.slurm_licence] == 2


def test_a_renamed_licence_closes_the_old_one(licensed_pool, fake_slurm):
    old = licensed_pool.slurm_licence
    passes.sync_pool(licensed_pool.pk)
    ResourcePool.objects.filter(pk=licensed_pool.pk).update(slurm_licence="qpu_renamed@gridgate")
    passes.sync_pool(licensed_pool.pk)
    assert fake_slurm.counts == {old: 0, "qpu_renamed@gridgate": 2}


def test_a_second_sync_of_a_pool_while_one_runs_leaves_it_pending_for_that_one(licensed_pool, fake_slurm):
    from apps.core.leases import acquire_lease

    assert acquire_lease(f"licence-sync:{licensed_pool.pk}", "another worker", passes.LEASE)
    assert passes.sync_pool(licensed_pool.pk) == "running elsewhere"
    assert LicenceState.objects.get(pool=licensed_pool).pending_since and fake_slurm.calls == []


def test_sync_licences_dry_run_says_what_it_would_do_and_changes_nothing(licensed_pool, fake_slurm, capsys):
    fake_slurm.counts[licensed_pool.slurm_licence] = 5
    call_command("sync_licences", "--dry-run")
    out = capsys.readouterr().out
    assert f"{licensed_pool.name}: {licensed_pool.slurm_licence}: Slurm has 5, wanted 2" in out
    assert fake_slurm.counts[licensed_pool.slurm_licence] == 5 and fake_slurm.calls == []
    call_command("sync_licences")
    assert fake_slurm.counts[licensed_pool.slurm_licence] == 2


def test_without_its_database_sync_licences_closes_every_licence_gridgate_made(
    licensed_pool, fake_slurm, monkeypatch, capsys
):
    fake_slurm.counts = {licensed_pool.slurm_licence: 2, "qpu_other@gridgate": 3}

    def unreachable(*args, **kwargs):
        raise OperationalError("connection to server at 127.0.0.1 failed")

    monkeypatch.setattr(ResourcePool.objects, "exclude", unreachable)
    with pytest.raises(SystemExit) as exited:
        call_command("sync_licences")
    assert exited.value.code == 1
    assert fake_slurm.counts == {licensed_pool.slurm_licence: 0, "qpu_other@gridgate": 0}
    assert "closed (count 0)" in capsys.readouterr().out


def test_a_licence_is_name_at_server_on_a_pool_with_slots_and_one_pool_each(licensed_pool):
    other = ResourcePool(name="other", slots_total=None, slurm_licence="qpu x")
    with pytest.raises(ValidationError) as refused:
        other.full_clean()
    assert {"slurm_licence"} <= set(refused.value.message_dict)
    other.slurm_licence = "qpu_other@gridgate"
    with pytest.raises(ValidationError, match="set slots_total first"):
        other.full_clean()
    other.slots_total, other.slurm_licence = 2, licensed_pool.slurm_licence
    with pytest.raises(ValidationError, match="already keeps this Slurm licence"):
        other.full_clean()


def test_a_deleted_pools_licence_is_closed(licensed_pool, fake_slurm, eager, api, staff):
    """Deleting a pool takes its licence state (what the sync made in Slurm) with it: its licence
    is closed then, or Slurm would go on handing out slots of a pool that no longer answers."""
    licence = licensed_pool.slurm_licence
    passes.sync_pool(licensed_pool.pk)
    assert fake_slurm.counts[licence] == 2
    assert eager(lambda: api(staff).delete(f"/api/v1/resource-pools/{licensed_pool.pk}/")).status_code == 204
    passes.reconcile()
    assert fake_slurm.counts[licence] == 0
