"""``manage.py doctor`` (R-BACK-5): one line per check, non-zero exit on failure."""

import io

import pytest
from django.core.management import CommandError, call_command

from apps.resources.models import ResourceClass, ResourcePool

pytestmark = pytest.mark.django_db


def doctor(*args):
    out = io.StringIO()
    try:
        call_command("doctor", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue()


def test_doctor_fake_backend_passes():
    code, out = doctor("--backend", "fake")
    assert code == 0
    assert out.splitlines()[0].startswith("OK    [fake] fake:")
    assert out.strip().endswith("1/1 checks passed")


def test_doctor_local_backend_checks_the_cases_root(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    code, out = doctor("--backend", "local")
    assert code == 0
    assert "cases root:" in out and "shell:" in out


def test_doctor_fails_with_an_actionable_message_and_non_zero_exit(monkeypatch, tmp_path):
    pool = ResourcePool.objects.create(
        name="hpc", kind="slurm", public=True, remote={"partition": "debug", "working_root": str(tmp_path / "w")}
    )
    ResourceClass.objects.create(pool=pool, name="core", cpu=1, memory=1, default=True)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no Slurm commands on this "host"
    code, out = doctor("--pool", str(pool.pk))
    assert code == 1
    lines = out.splitlines()
    assert "FAIL  [slurm pool=hpc] command sbatch: sbatch is not on PATH: install the Slurm client tools" in out
    assert any(line.startswith("OK    [slurm pool=hpc] working_root:") for line in lines)
    assert lines[-1].endswith("checks passed") and not lines[-1].startswith("OK")


def test_doctor_refuses_unknown_backend_and_runai_pool():
    with pytest.raises(CommandError):
        doctor("--backend", "nope")
    pool = ResourcePool.objects.create(
        name="gpu", kind="runai", public=True, remote={"base_url": "https://runai.example.org"}
    )
    with pytest.raises(CommandError, match="no case backend"):
        doctor("--pool", str(pool.pk))


def test_doctor_never_prints_a_secret_from_a_crashing_check(monkeypatch, capsys):
    """R-BACK-1: a check that raises with a credential in its message is scrubbed."""
    from apps.backends.fake import FakeBackend

    monkeypatch.setenv("GG_TEST_TOKEN", "s3cr3t-token-value")
    pool = ResourcePool.objects.create(name="loc", kind="local", public=True, remote={"token_env": "GG_TEST_TOKEN"})

    def leaky(self, pool=None):
        raise RuntimeError("401 for token s3cr3t-token-value")

    monkeypatch.setattr(FakeBackend, "doctor", leaky)
    code, out = doctor("--backend", "fake", "--pool", str(pool.pk))
    assert code == 1
    assert "s3cr3t-token-value" not in out and "***" in out


def heartbeat_as(host: str, root):
    """A worker host's heartbeat, writing its marker under the cases root as that host sees it."""
    from django.test import override_settings

    from apps.core import tasks

    with override_settings(GRIDGATE_WORKER_HOST=host, GRIDGATE_CASES_ROOT=root):
        tasks.heartbeat()


def test_doctor_sees_every_live_worker_hosts_marker_on_a_shared_cases_root(settings, tmp_path):
    """Issue 17: remote-backend workspaces are read and written by any worker host."""
    settings.GRIDGATE_CASES_ROOT = tmp_path / "shared"
    heartbeat_as("host-a", tmp_path / "shared")
    heartbeat_as("host-b", tmp_path / "shared")
    code, out = doctor("--backend", "slurm")
    assert "OK    [site] cases root shared:" in out and "host-a, host-b" in out


def test_doctor_fails_naming_a_live_host_that_does_not_share_the_cases_root(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "a"
    heartbeat_as("host-a", tmp_path / "a")
    heartbeat_as("host-b", tmp_path / "b")  # its own local disk: its marker is not visible here
    code, out = doctor("--backend", "slurm")
    assert code == 1
    line = next(line for line in out.splitlines() if "cases root shared" in line)
    assert line.startswith("FAIL  [site]") and "host(s) host-b:" in line and "shared file system" in line


def test_doctor_ignores_an_old_marker_left_from_when_the_root_was_shared(settings, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from apps.core.models import WorkerHeartbeat

    settings.GRIDGATE_CASES_ROOT = tmp_path / "a"
    heartbeat_as("host-b", tmp_path / "a")
    heartbeat_as("host-b", tmp_path / "b")  # then it moved to a root of its own
    WorkerHeartbeat.objects.update(seen_at=timezone.now() + timedelta(seconds=30))  # a later beat
    code, out = doctor("--backend", "slurm")
    assert code == 1 and "host(s) host-b:" in out


def test_doctor_checks_the_shared_root_only_for_backends_that_need_it(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "a"
    heartbeat_as("host-b", tmp_path / "b")
    code, out = doctor("--backend", "local")  # host-bound: each host keeps its own cases
    assert "cases root shared" not in out
