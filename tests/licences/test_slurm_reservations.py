"""R-RES-3 on a real Slurm with accounting (the cluster .ci/run starts): a window of a licensed
pool becomes a Slurm reservation of its licence, with its holders' Unix accounts; a holder's
batch job runs in it (``--reservation``), an outsider's waits for the licence; the reconcile
pass repairs a reservation changed or removed by hand; cancelling the window removes it."""

import subprocess
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.licences import passes, scontrol
from apps.licences.models import LicenceState
from apps.qrmi.models import UnixAccount
from apps.reservations.models import Reservation
from apps.reservations.services import cancel_reservation, save_reservation
from tests.licences.conftest import slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

HOLDER, OUTSIDER = "nobody", "daemon"  # Unix accounts every Debian host has


def scontrol_show(name: str) -> str:
    done = subprocess.run(
        ["scontrol", "show", "reservation", name, "-o"], env=slurm_env(), capture_output=True, text=True, timeout=30
    )
    return done.stdout if done.returncode == 0 else ""


def sbatch_as(user: str, *args: str) -> str:
    done = subprocess.run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null", *args],
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def job_state(job_id: str) -> tuple[str, str]:
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T %r"], env=slurm_env(), capture_output=True, text=True, timeout=30
    ).stdout.split()
    if out:
        return out[0], out[1]
    done = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], env=slurm_env(), capture_output=True, text=True
    )
    return (done.stdout.strip().splitlines() or ["GONE"])[0], ""


@pytest.fixture
def window(real_licences, licensed_pool, django_user_model):
    holder = django_user_model.objects.create_user("holder")
    UnixAccount.objects.create(user=holder, unix_uid=65534)
    now = timezone.now()
    reservation = save_reservation(
        Reservation(
            pool=licensed_pool, start=now - timedelta(minutes=1), end=now + timedelta(minutes=20), slots=2, title="Run"
        ),
        users=[holder],
    )
    yield reservation
    subprocess.run(
        ["scontrol", "delete", f"reservationname={reservation.slurm_name}"], env=slurm_env(), capture_output=True
    )


def test_r_res_3_a_window_is_a_slurm_reservation_of_the_licence_for_its_holders(window, licensed_pool, real_licences):
    outcome = passes.sync_pool(licensed_pool.pk)
    assert f"created {window.slurm_name}" in outcome
    shown = scontrol_show(window.slurm_name)
    assert f"Licenses={real_licences}:2" in shown and f"Users={HOLDER}" in shown and "ANY_NODES" in shown
    assert LicenceState.objects.get(pool=licensed_pool).reservations == [window.slurm_name]
    assert passes.sync_pool(licensed_pool.pk) == "unchanged"  # in step: nothing to do


def test_r_res_3_a_holders_job_runs_in_the_window_and_an_outsiders_waits(window, licensed_pool, real_licences):
    passes.sync_pool(licensed_pool.pk)
    outsider = sbatch_as(OUTSIDER, f"-L{real_licences}:1", "--time=2", "--wrap", "sleep 1")
    holder = sbatch_as(HOLDER, f"--reservation={window.slurm_name}", f"-L{real_licences}:1", "--wrap", "sleep 1")
    try:
        deadline, seen = time.monotonic() + 90, set()
        while time.monotonic() < deadline:
            state, reason = job_state(outsider)
            seen.add((state, reason))
            if job_state(holder)[0] == "COMPLETED":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the holder's job did not run in its reservation: {job_state(holder)}")
        state, reason = job_state(outsider)
        assert state == "PENDING", (state, reason)
        assert reason == "Licenses", reason  # Slurm's own reason: the licence's free count is reserved
        assert all(s == "PENDING" for s, _ in seen), seen
    finally:
        subprocess.run(["scancel", outsider, holder], env=slurm_env(), capture_output=True)


def test_r_res_3_the_reconcile_pass_repairs_a_reservation_changed_or_removed_by_hand(
    window, licensed_pool, real_licences
):
    passes.sync_pool(licensed_pool.pk)
    subprocess.run(
        ["scontrol", "update", f"reservationname={window.slurm_name}", f"licenses={real_licences}:1"],
        env=slurm_env(),
        check=True,
        capture_output=True,
    )
    assert f"changed {window.slurm_name}" in passes.reconcile()[licensed_pool.pk]
    assert f"Licenses={real_licences}:2" in scontrol_show(window.slurm_name)
    subprocess.run(["scontrol", "delete", f"reservationname={window.slurm_name}"], env=slurm_env(), check=True)
    assert f"created {window.slurm_name}" in passes.reconcile()[licensed_pool.pk]
    cancel_reservation(Reservation.objects.get(pk=window.pk))
    assert f"removed {window.slurm_name}" in passes.sync_pool(licensed_pool.pk)
    assert scontrol_show(window.slurm_name) == ""


def test_r_res_3_a_maintenance_window_reserves_all_of_the_licence(real_licences, licensed_pool):
    now = timezone.now()
    maintenance = save_reservation(
        Reservation(
            pool=licensed_pool,
            kind="maintenance",
            start=now + timedelta(hours=1),
            end=now + timedelta(hours=2),
            title="Cal",
        )
    )
    try:
        passes.sync_pool(licensed_pool.pk)
        shown = scontrol_show(maintenance.slurm_name)
        assert f"Licenses={real_licences}:2" in shown and "MAINT" in shown
        assert scontrol.operator() in shown
    finally:
        subprocess.run(["scontrol", "delete", f"reservationname={maintenance.slurm_name}"], env=slurm_env())


def test_r_res_3_dry_run_shows_the_reservations_and_doctor_checks_them(window, licensed_pool, real_licences):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("sync_licences", "--dry-run", stdout=out)
    assert f"reservation {window.slurm_name}" in out.getvalue() and "missing: would create" in out.getvalue()
    assert not passes.calendar_check()[0]
    passes.sync_pool(licensed_pool.pk)
    out = StringIO()
    call_command("sync_licences", "--dry-run", stdout=out)
    assert "in step" in out.getvalue()
    ok, message = passes.calendar_check()
    assert ok, message
