"""Slurm licences on a real Slurm with accounting (slurmdbd + MariaDB, the cluster .ci/run starts
with SLURM_LOCAL_ACCOUNTING=1): sacctmgr as the worker runs it, and batch jobs that wait for the
licence in Slurm's queue and acquire their slots through the QRMI endpoint with real MUNGE
credentials (docs/qrmi.md, "Slurm licences")."""

import subprocess
import textwrap
import time

import pytest
from django.db import connection

from apps.licences import passes, sacctmgr
from apps.licences.models import LicenceState
from apps.qrmi.models import UnixAccount
from apps.resources.models import ResourcePool
from apps.sessions import services as sessions
from apps.sessions.models import Session
from tests.licences.conftest import slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

USER_UID = 65534  # "nobody": the jobs acquire for it, as the SPANK plugin acquires for a job's user


def test_a_rest_session_lowers_the_licence_and_its_release_raises_it(real_licences, licensed_pool, owner, settings):
    settings.GRIDGATE_TASKS_EAGER = True  # the sync runs as soon as the admission commits
    passes.sync_pool(licensed_pool.pk)
    assert sacctmgr.count(real_licences) == 2
    session = sessions.admit(user=owner, resource_class=licensed_pool.classes.get()).session
    assert sacctmgr.count(real_licences) == 1
    sessions.release(user=owner, session_id=session.pk)
    assert sacctmgr.count(real_licences) == 2


def test_an_inaccessible_pool_closes_its_licence_in_slurm(real_licences, licensed_pool, settings):
    settings.GRIDGATE_TASKS_EAGER = True
    passes.sync_pool(licensed_pool.pk)
    pool = ResourcePool.objects.get(pk=licensed_pool.pk)
    pool.is_accessible, pool.accessibility_message = False, "calibration"
    pool.save()
    assert sacctmgr.count(real_licences) == 0
    assert LicenceState.objects.get(pool=licensed_pool).reason == "the pool is offline: calibration"


def test_a_failing_sacctmgr_is_counted_and_the_next_pass_repairs_it(real_licences, licensed_pool, settings, tmp_path):
    broken = tmp_path / "slurm.conf"
    broken.write_text("ClusterName=nowhere\nSlurmctldHost=nowhere\nAccountingStorageHost=127.0.0.1\n")
    settings.GRIDGATE_LICENCE_SLURM_CONF = str(broken)
    assert passes.reconcile()[licensed_pool.pk] == "failed"
    state = LicenceState.objects.get(pool=licensed_pool)
    assert state.failures == 1 and state.error
    settings.GRIDGATE_LICENCE_SLURM_CONF = slurm_env()["SLURM_CONF"]
    assert passes.reconcile()[licensed_pool.pk] == "created"
    assert sacctmgr.count(real_licences) == 2
    assert LicenceState.objects.get(pool=licensed_pool).failures == 0


def test_a_count_changed_by_hand_is_repaired_by_the_reconcile_pass(real_licences, licensed_pool):
    passes.reconcile()
    subprocess.run(
        ["sacctmgr", "-i", "modify", "resource", f"name={real_licences.name}", f"server={real_licences.server}"]
        + ["set", "count=9"],
        env=slurm_env(),
        check=True,
        capture_output=True,
        timeout=30,
    )
    assert sacctmgr.count(real_licences) == 9
    assert passes.reconcile()[licensed_pool.pk] == "set from 9"
    assert sacctmgr.count(real_licences) == 2


JOB = textwrap.dedent(
    """\
    #!/bin/bash
    #SBATCH -L {licence}:1
    #SBATCH --cpus-per-task=1 --mem=64M --time=5
    #SBATCH -o {outdir}/%j.out
    exec /usr/bin/python3 - <<'PY'
    import json, os, subprocess, time, urllib.error, urllib.request
    base = "{base}"

    def call(method, path, body=None):
        cred = subprocess.run(["munge", "-n"], capture_output=True, text=True, check=True).stdout.strip()
        data = json.dumps(body).encode() if body is not None else None
        headers = {{"X-Munge-Cred": cred, "Content-Type": "application/json"}}
        request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read() or b"{{}}")
        except urllib.error.HTTPError as refused:
            return refused.code, {{}}

    job = os.environ["SLURM_JOB_ID"]
    status, session = call("POST", "/sessions", {{"user_id": "{uid}", "scheduler_job_id": job, "qpu_slots": 1}})
    print("acquire", status, flush=True)
    if status in (200, 201):
        time.sleep(4)
        print("release", call("DELETE", "/sessions/" + session["id"])[0], flush=True)
    PY
    """
)


def test_jobs_wait_in_slurms_queue_for_the_licence_and_every_acquire_finds_its_slot(
    real_licences, licensed_pool, live_server, settings, django_user_model, tmp_path, munged
):
    """Two slots, six jobs asking for one licence each and acquiring one slot through the QRMI
    endpoint: at most two hold a session at once, the others wait with reason Licenses (not
    Resources: the cluster has CPUs for more), no acquire is refused, all six complete."""
    settings.GRIDGATE_TASKS_EAGER = True
    user = django_user_model.objects.create_user("nobody-user")
    UnixAccount.objects.create(user=user, unix_uid=USER_UID)
    passes.sync_pool(licensed_pool.pk)
    assert sacctmgr.count(real_licences) == 2
    outdir = tmp_path / "jobs"
    outdir.mkdir()
    script = JOB.format(
        licence=real_licences, outdir=outdir, base=f"{live_server.url}/qrmi/{licensed_pool.name}", uid=USER_UID
    )
    job_ids = []
    for _ in range(6):
        done = subprocess.run(
            ["sbatch", "--parsable"], input=script, env=slurm_env(), capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        job_ids.append(done.stdout.strip().split(";")[0])
    reasons = set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T %r"],
            env=slurm_env(),
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split("\n")
        live = [line.split() for line in listed if line.strip()]
        reasons |= {reason for _, state, reason in live if state == "PENDING"}
        if not live:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the jobs did not all end within 240 s: {live}")
    outputs = {job: (outdir / f"{job}.out").read_text() for job in job_ids}
    assert all("acquire 200" in out and "release 200" in out for out in outputs.values()), outputs
    assert "Licenses" in reasons, reasons
    connection.close()
    held = sorted(Session.objects.filter(pool=licensed_pool).values_list("created_at", "revoked_at"))
    assert len(held) == 6
    events = sorted([(start, 1) for start, _ in held] + [(end, -1) for _, end in held], key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 2
