"""``manage.py doctor`` (R-BACK-5): one line per check, non-zero exit on failure."""

import io
import os
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from apps.backends.remote import clear_clients
from apps.core import hosts, tasks
from apps.resources.models import ResourcePool
from tests import factories

pytestmark = pytest.mark.django_db


def doctor(*args):
    out = io.StringIO()
    try:
        call_command("doctor", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue()


def test_doctor_fake_backend_passes(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    code, out = doctor("--backend", "fake")
    assert code == 0
    assert out.splitlines()[0].startswith("OK    [site] cases root:")
    assert out.splitlines()[1].startswith("OK    [site] cases root shared: no worker host heartbeat")
    assert out.splitlines()[2].startswith("OK    [site] cases root space:") and "GiB free under" in out
    assert out.splitlines()[3].startswith("OK    [fake] fake:")
    assert out.strip().endswith("4/4 checks passed")


def test_doctor_creates_a_missing_cases_root_0711_before_any_backend_check(settings, tmp_path):
    """The local backend's check made the root with the umask's 0755 when doctor ran first."""
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    code, out = doctor("--backend", "local")
    assert "OK    [site] cases root: " in out and "created, mode 0711" in out
    assert (tmp_path / "cases").stat().st_mode & 0o777 == 0o711


def test_doctor_closes_a_listable_cases_root_and_fails_on_one_it_cannot(settings, tmp_path):
    root = tmp_path / "cases"
    root.mkdir()
    root.chmod(0o755)  # noqa: S103
    settings.GRIDGATE_CASES_ROOT = root
    code, out = doctor("--backend", "fake")
    assert code == 0 and "was mode 0755, readable by other accounts: now 0711" in out
    if os.geteuid() != 0:
        return  # giving the root to another account needs root
    root.chmod(0o755)  # noqa: S103
    os.chown(root, 65534, -1)
    code, out = doctor("--backend", "fake")
    line = next(line for line in out.splitlines() if "cases root:" in line)
    assert code == 1 and line.startswith("FAIL  [site] cases root:") and f"chmod 0711 {root}" in line


def test_doctor_local_backend_checks_the_cases_root(settings, tmp_path, sandbox_host):
    """Every check passes on a host with the sandbox (skipped without bubblewrap outside CI)."""
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    code, out = doctor("--backend", "local")
    assert code == 0
    assert "cases root:" in out and "shell:" in out


def test_doctor_fails_while_the_cases_roots_parent_is_the_services_to_write(
    settings, tmp_path, monkeypatch, sandbox_host
):
    """F4: a service that can write the directory above the cases root can swap the root for a
    link while the privileged helper works in it as root. doctor says so for pools whose cases
    the helper runs (not for a trusted pool, which runs as the service anyway)."""
    from apps.core import cases_root

    service_uid = 4242  # the service's own account (not root: a root service has nothing to gain)
    parent = tmp_path / "srv-gridgate-var"
    parent.mkdir(mode=0o755)
    settings.GRIDGATE_CASES_ROOT = parent / "cases"
    ResourcePool.objects.create(name="shared", kind="local", public=True)
    monkeypatch.setattr(cases_root.os, "geteuid", lambda: service_uid)
    monkeypatch.setattr(cases_root.os, "getegid", lambda: service_uid)
    monkeypatch.setattr(cases_root.os, "getgroups", lambda: [service_uid])
    os.chown(parent, service_uid, service_uid)
    closed, message = cases_root.root_parent_check()
    assert not closed and f"chown root:root {parent}" in message
    from apps.backends.local import LocalBackend

    pool = ResourcePool.objects.get(name="shared")
    line = next(check for check in LocalBackend().doctor(pool) if check.name == "cases root parent")
    assert not line.ok and str(parent) in line.message
    os.chown(parent, 0, 0)
    assert cases_root.root_parent_check()[0]
    pool.trusted, pool.public = True, False
    assert not any(check.name == "cases root parent" for check in LocalBackend().doctor(pool))


def test_doctor_fails_with_an_actionable_message_and_non_zero_exit(monkeypatch, tmp_path):
    remote = {"partition": "debug", "working_root": str(tmp_path / "w")}
    pool = factories.pool("hpc", kind="slurm", remote=remote, class_name="core")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no Slurm commands on this "host"
    code, out = doctor("--pool", str(pool.pk))
    assert code == 1
    lines = out.splitlines()
    assert "FAIL  [slurm pool=hpc] command sbatch: sbatch is not on PATH: install the Slurm client tools" in out
    assert any(line.startswith("OK    [slurm pool=hpc] working_root:") for line in lines)
    assert lines[-1].endswith("checks passed") and not lines[-1].startswith("OK")


def test_doctor_refuses_unknown_backend_and_a_kind_left_out_of_the_mapping(settings):
    with pytest.raises(CommandError):
        doctor("--backend", "nope")
    settings.GRIDGATE_CASE_BACKENDS = {"local": "local"}
    pool = ResourcePool.objects.create(
        name="gpu", kind="runai", public=True, remote={"base_url": "https://runai.example.org"}
    )
    with pytest.raises(CommandError, match="no case backend"):
        doctor("--pool", str(pool.pk))


@pytest.mark.parametrize("driver", ["runai"], indirect=True)
def test_doctor_checks_a_runai_pools_token_project_cluster_node_pool_and_volume(driver):
    """R-BACK-5 for Run:AI: every check passes against the double (test_remote_contract.py proves
    each is printed and none prints the secret), saying what it found, the node pool's included."""
    pool = driver.service_pool(name="gpu", host_path="/data/gridgate", node_pool="a100")
    code, out = doctor("--pool", str(pool.pk))
    assert code == 0, out
    for line in ("sdk: runapy", "project: project team-a is visible", "cluster: cluster",
                 "node pool: node pool a100 exists"):  # fmt: skip
        assert f"OK    [runai pool=gpu] {line}" in out, line


@pytest.mark.parametrize("driver", ["runai"], indirect=True)
def test_doctor_says_which_runai_check_fails_and_how_to_fix_it(driver, monkeypatch):
    pool = driver.service_pool(name="gpu", host_path="/data/gridgate", project="team-z", node_pool="h200")
    code, out = doctor("--pool", str(pool.pk))
    assert code == 1
    assert "FAIL  [runai pool=gpu] project: project 'team-z' is not visible to the credential" in out
    assert "FAIL  [runai pool=gpu] node pool: node pool 'h200' is not one of default, a100" in out
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_SECRET", "wrong-secret")
    clear_clients()
    code, out = doctor("--pool", str(pool.pk))
    assert code == 1 and "FAIL  [runai pool=gpu] token: " in out and "401" in out
    assert "wrong-secret" not in out


def test_doctor_never_prints_a_secret_from_a_crashing_check(monkeypatch, capsys):
    """R-BACK-1: a check that raises with a credential in its message is scrubbed."""
    from apps.backends.fake import FakeBackend

    monkeypatch.setenv("GRIDGATE_CRED_TEST_TOKEN", "s3cr3t-token-value")
    pool = ResourcePool.objects.create(
        name="loc", kind="local", public=True, remote={"token_env": "GRIDGATE_CRED_TEST_TOKEN"}
    )

    def leaky(self, pool=None):
        raise RuntimeError("401 for token s3cr3t-token-value")

    monkeypatch.setattr(FakeBackend, "doctor", leaky)
    code, out = doctor("--backend", "fake", "--pool", str(pool.pk))
    assert code == 1
    assert "s3cr3t-token-value" not in out and "***" in out


def heartbeat_as(host: str, root):
    """A worker host's heartbeat, writing its marker under the cases root as that host sees it."""
    with override_settings(GRIDGATE_WORKER_HOST=host, GRIDGATE_CASES_ROOT=root):
        tasks.heartbeat()


@pytest.mark.parametrize(("backend", "hosts"), [("slurm", ("host-a", "host-b")), ("local", ("solo",))])
def test_doctor_sees_every_live_worker_hosts_marker_on_a_shared_cases_root(settings, tmp_path, backend, hosts):
    """Remote-backend workspaces are read and written by any worker host; a single host sees its
    own marker under its own root."""
    settings.GRIDGATE_CASES_ROOT = tmp_path / "shared"
    for host in hosts:
        heartbeat_as(host, tmp_path / "shared")
    code, out = doctor("--backend", backend)
    assert "OK    [site] cases root shared:" in out and ", ".join(hosts) in out


@pytest.mark.parametrize("backend", ["slurm", "local"])
def test_doctor_fails_naming_a_live_host_that_does_not_share_the_cases_root(settings, tmp_path, backend):
    """The web writes a local case's inputs and serves its results from the cases root, and any
    worker host may submit its launch: local cases need the shared root as well."""
    settings.GRIDGATE_CASES_ROOT = tmp_path / "a"
    heartbeat_as("host-a", tmp_path / "a")
    heartbeat_as("host-b", tmp_path / "b")  # its own local disk: its marker is not visible here
    code, out = doctor("--backend", backend)
    assert code == 1
    line = next(line for line in out.splitlines() if "cases root shared" in line)
    assert line.startswith("FAIL  [site]") and "host(s) host-b:" in line and "shared file system" in line


def test_doctor_ignores_an_old_marker_left_from_when_the_root_was_shared(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "a"
    heartbeat_as("host-b", tmp_path / "b")  # it beats now, through a root of its own
    long_ago = timezone.now() - timedelta(seconds=settings.GRIDGATE_WORKER_STALE_SECONDS + 5)
    with override_settings(GRIDGATE_CASES_ROOT=tmp_path / "a"):
        hosts.write_marker("host-b", long_ago)  # what it left in the shared root before it moved
    code, out = doctor("--backend", "slurm")
    assert code == 1 and "host(s) host-b:" in out


def test_doctor_accepts_a_marker_an_nfs_cache_still_shows_from_an_earlier_beat(settings, tmp_path):
    """NFS serves a name from its caches for 30-60 s: the marker seen may be several beats old.
    Recent enough is within GRIDGATE_WORKER_STALE_SECONDS, not a few seconds of the last beat."""
    settings.GRIDGATE_CASES_ROOT = tmp_path / "shared"
    settings.GRIDGATE_WORKER_STALE_SECONDS = 60
    heartbeat_as("host-a", tmp_path / "shared")
    hosts.write_marker("host-a", timezone.now() - timedelta(seconds=40))  # what the cache still shows
    code, out = doctor("--backend", "slurm")
    assert "OK    [site] cases root shared:" in out and "host-a" in out
