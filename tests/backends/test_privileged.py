"""The privileged helper is the only root code, and it trusts nothing its caller says.

The first tests ask it, as root, to do what a compromised service would ask: switch to root or a
system account, reach outside the cases root, follow a link the service planted, hand over a
file that is not the service's, signal a process a forged pid file names. The last one runs a
real worker as an unprivileged service account whose only way to root is the documented sudo
rule (root, bwrap and sudo needed; required under CI)."""

import fcntl
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection

from apps.backends import as_root, privileged
from apps.cases.models import Case, CaseStatus
from tests.backends.conftest import _required_or_skip

ROOT = Path(__file__).resolve().parents[2]
SERVICE_ACCOUNT = "gridgate-svc"
#: where the sudo test's service keeps its workspaces: named in the helper's own configuration
SUDO_CASES_ROOT = Path("/var/tmp/gridgate-sudo-tests/cases")
BOUNDS = {"memory_bytes": 1 << 30, "cpu": 1, "tasks": 64, "disk_bytes": 1 << 30}


def config(tmp_path, **changes) -> privileged.Config:
    fields = {"cases_root": str(tmp_path), "service_uid": os.geteuid(), "service_gid": os.getegid(), "min_uid": 100}
    fields.update(changes)
    return privileged.Config(**fields)


def prepared_case(cases_root: Path, **changes) -> tuple[privileged.Config, str, Path]:
    """The helper's configuration for ``cases_root``, a case's id and its run directory as the
    service prepares it (work/ and an inputs manifest)."""
    case = str(uuid.uuid4())
    rdir = cases_root / case / ".run"
    (rdir / "work").mkdir(parents=True)
    rdir.chmod(0o700)
    (rdir / "manifest.json").write_text("{}")
    return config(cases_root, **changes), case, rdir


@pytest.fixture
def account(sandbox_host):
    return sandbox_host["gridgate-test1"]


@pytest.fixture(autouse=True)
def one_request_per_test():
    """The helper serves one request per process and opens each configured root once for it;
    called in-process, each test is one request."""
    yield
    privileged.close_roots()


def test_the_helper_never_switches_to_root_the_service_or_a_system_account(tmp_path, sandbox_host):
    settings = config(tmp_path, service_uid=sandbox_host["gridgate-test2"].pw_uid, min_uid=1000)
    for uid, why in (
        (0, "root"),
        (sandbox_host["gridgate-test2"].pw_uid, "the service"),
        (pwd.getpwnam("daemon").pw_uid, "system account"),
        (4_000_000_000, "no account"),
    ):
        with pytest.raises(privileged.Refused) as refused:
            privileged.account(settings, {"account": {"uid": uid}})
        assert why in str(refused.value), uid
    named = config(tmp_path, min_uid=1000, sandbox_accounts=["gridgate-sandbox"])
    sandbox = sandbox_host["gridgate-sandbox"]
    assert privileged.account(named, {"account": {"uid": sandbox.pw_uid}}).pw_uid == sandbox.pw_uid


def test_the_helper_never_runs_a_case_as_nobody_or_another_overflow_id(tmp_path, sandbox_host, monkeypatch):
    """F7: uid 65534 (nobody) is the kernel's overflow id: every file a user namespace or an NFS
    export cannot map shows as its. Even named as a sandbox account, and for whatever the kernel
    says its overflow ids are, the helper refuses it."""
    nobody = pwd.getpwuid(65534)
    named = config(tmp_path, min_uid=1000, sandbox_accounts=[nobody.pw_name, "gridgate-test1"])
    with pytest.raises(privileged.Refused, match="overflow"):
        privileged.account(named, {"account": {"uid": 65534}})
    other = sandbox_host["gridgate-test1"]
    assert privileged.account(named, {"account": {"uid": other.pw_uid}}).pw_uid == other.pw_uid
    monkeypatch.setattr(privileged, "overflow_ids", lambda: {65534, other.pw_uid})  # a kernel set otherwise
    with pytest.raises(privileged.Refused, match="overflow"):
        privileged.account(named, {"account": {"uid": other.pw_uid}})
    assert as_root.config()["sandbox_accounts"] == [as_root.settings.GRIDGATE_SANDBOX_USER]


def test_the_cases_root_swapped_between_two_steps_of_a_request_changes_nothing_of_roots(
    tmp_path, sandbox_host, monkeypatch
):
    """F4: the service owns the directory above the cases root; the helper opened the root by path
    at each step of a request, so renaming it away and linking a directory of root's in its
    place between two steps had root create a directory of the service's inside root's (121 tries
    in 60 s). The swap is made here at the exact moment, after the request's first open of the
    root: the helper goes on in the root it opened."""
    service = sandbox_host["gridgate-test2"]
    parent = tmp_path / "service-owned"
    cases = parent / "cases"
    roots = tmp_path / "roots-own"
    roots.mkdir(mode=0o755)
    settings, case, rdir = prepared_case(cases, service_uid=service.pw_uid, service_gid=service.pw_gid)
    for path in (parent, cases, cases / case, rdir, rdir / "work"):
        os.chown(path, service.pw_uid, service.pw_gid)
    (rdir / "work" / "progress.txt").write_text("0.5")
    os.chown(rdir / "work" / "progress.txt", service.pw_uid, service.pw_gid)

    real_open, swapped = os.open, []

    def open_then_swap(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        if str(path) == str(cases) and not swapped:
            os.rename(cases, parent / "cases.moved")  # what the service may do to its own directory
            os.symlink(roots, cases)
            swapped.append(True)
        return fd

    monkeypatch.setattr(privileged.os, "open", open_then_swap)
    privileged.collect(settings, {"case_id": case, "what": "live", "globs": ["*.txt"]})
    monkeypatch.setattr(privileged.os, "open", real_open)
    assert swapped
    assert list(roots.iterdir()) == []  # nothing made in root's directory
    assert (parent / "cases.moved" / case / "live" / "progress.txt").read_text() == "0.5"


@pytest.mark.parametrize("case", ["../../etc", "/etc", "not-a-uuid", "", None, 7])
def test_a_case_id_that_is_not_a_uuid_is_refused(tmp_path, case):
    with pytest.raises(privileged.Refused):
        privileged.run_dir(config(tmp_path), {"case_id": case})


def test_a_run_directory_that_is_a_link_or_not_the_services_is_refused(tmp_path, account):
    settings, case, rdir = prepared_case(tmp_path)
    shutil.rmtree(rdir)
    rdir.symlink_to("/etc", target_is_directory=True)  # the service swapped it for a link
    with pytest.raises(privileged.Refused):
        privileged.run_dir(settings, {"case_id": case})
    rdir.unlink()
    rdir.mkdir(mode=0o700)
    os.chown(rdir, account.pw_uid, account.pw_gid)  # someone else's
    with pytest.raises(privileged.Refused, match="not the service's"):
        privileged.run_dir(settings, {"case_id": case})
    os.chown(rdir, os.geteuid(), os.getegid())
    rdir.chmod(0o777)  # others may write it
    with pytest.raises(privileged.Refused):
        privileged.run_dir(settings, {"case_id": case})


def test_a_working_directory_holding_a_hard_link_or_someone_elses_file_is_not_handed_over(tmp_path, account):
    settings, case, rdir = prepared_case(tmp_path)
    work = rdir / "work"
    secret = tmp_path / "root-only"
    secret.write_text("secret")
    secret.chmod(0o600)
    os.link(secret, work / "looks-like-an-input")
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(privileged.Refused, match="not a single regular file"):
            privileged.give_tree(fd, account, service_uid=settings.service_uid)
        (work / "looks-like-an-input").unlink()
        other = work / "theirs"
        other.write_text("x")
        os.chown(other, pwd.getpwnam("daemon").pw_uid, 0)
        with pytest.raises(privileged.Refused, match="neither the service's nor the case's"):
            privileged.give_tree(fd, account, service_uid=settings.service_uid)
    finally:
        os.close(fd)
    assert secret.stat().st_uid == 0 and secret.stat().st_mode & 0o777 == 0o600


def test_stop_never_signals_a_process_a_forged_pid_file_names(tmp_path):
    """The pid file is the service's: it may name any process. Only a root process of this
    helper sitting in this very run directory is signalled."""
    settings, case, rdir = prepared_case(tmp_path)
    bystander = subprocess.Popen(["sleep", "60"], cwd=tmp_path)
    try:
        (rdir / "pid").write_text(str(bystander.pid))
        assert privileged.stop(settings, {"case_id": case, "grace": 0}) == {"stopped": False}
        assert bystander.poll() is None  # untouched
        (rdir / "pid").write_text("1")
        assert privileged.stop(settings, {"case_id": case, "grace": 0}) == {"stopped": False}
    finally:
        bystander.kill()
        bystander.wait()


def test_collecting_results_replaces_a_link_planted_in_the_workspace_and_writes_nothing_through_it(tmp_path):
    settings, case, rdir = prepared_case(tmp_path)
    (rdir / "work" / "out.txt").write_text("result")
    results = tmp_path / case / "results"
    results.mkdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    (results / "out.txt").symlink_to(target)  # planted by the service, which owns results/
    assert privileged.collect(settings, {"case_id": case, "what": "results"}) == {"copied": ["out.txt"]}
    assert target.read_text() == "keep"
    assert not (results / "out.txt").is_symlink() and (results / "out.txt").read_text() == "result"


def test_without_sudo_the_helper_answers_a_refusal_as_json_and_under_sudo_ignores_the_callers_configuration(tmp_path):
    """What the helper tells its caller, and that under sudo (SUDO_UID set by sudo) only its
    own file counts: a request naming '/' as its cases root gets nothing from it."""
    request = {"version": privileged.PROTOCOL, "config": {"cases_root": "/", "service_uid": 0, "service_gid": 0}}
    helper = [sys.executable, "-I", "-S", str(as_root.HELPER)]
    refused = subprocess.run(
        [*helper, "start"], input=json.dumps({**request, "case_id": "../x"}), capture_output=True, text=True
    )
    assert refused.returncode == 2 and "UUID" in json.loads(refused.stdout)["error"]
    env = {"PATH": privileged.DEFAULT_PATH, "SUDO_UID": "4242"}
    as_sudo = subprocess.run([*helper, "version"], input=json.dumps(request), capture_output=True, text=True, env=env)
    answer = json.loads(as_sudo.stdout)
    if Path(privileged.CONFIG_FILE).exists():
        assert "service account named in the configuration" in answer["error"]
    else:
        assert privileged.CONFIG_FILE in answer["error"]
    old = dict(request, version=privileged.PROTOCOL - 1)
    skewed = subprocess.run([*helper, "version"], input=json.dumps(old), capture_output=True, text=True)
    assert "install the helper from the same checkout" in json.loads(skewed.stdout)["error"]


# -- a real unprivileged service, root only through sudo -------------------------------------------
@pytest.fixture
def sudo_service(sandbox_host):
    """The service account, the documented sudo rule for this checkout's helper, and the
    helper's own configuration (root's files, as docs/deployment.md has them)."""
    if shutil.which("sudo") is None:
        _required_or_skip("sudo is not installed (apt install sudo)")
    try:
        service = pwd.getpwnam(SERVICE_ACCOUNT)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_ACCOUNT])
        service = pwd.getpwnam(SERVICE_ACCOUNT)
    rule = Path("/etc/sudoers.d/gridgate-tests")
    python = "/usr/bin/python3"
    rule.write_text(f"{SERVICE_ACCOUNT} ALL=(root) NOPASSWD: {python} -I -S {as_root.HELPER} *\n")
    rule.chmod(0o440)
    conf = Path(privileged.CONFIG_FILE)
    conf.parent.mkdir(mode=0o755, exist_ok=True)
    helper_config = {"cases_root": str(SUDO_CASES_ROOT), "service_uid": service.pw_uid, "service_gid": service.pw_gid}
    conf.write_text(json.dumps({**helper_config, "min_uid": 100, "sandbox_accounts": ["gridgate-sandbox"]}))
    conf.chmod(0o644)
    shutil.rmtree(SUDO_CASES_ROOT, ignore_errors=True)
    SUDO_CASES_ROOT.mkdir(parents=True)
    SUDO_CASES_ROOT.chmod(0o711)
    os.chown(SUDO_CASES_ROOT, service.pw_uid, service.pw_gid)
    yield service, f"sudo -n {python} -I -S {as_root.HELPER}"
    rule.unlink(missing_ok=True)
    conf.unlink(missing_ok=True)
    shutil.rmtree(SUDO_CASES_ROOT.parent, ignore_errors=True)


def as_service(service, code: str, env: dict) -> subprocess.CompletedProcess:
    """``code`` in a Django process of the service account (no capability, its own groups only)."""
    return subprocess.run(
        ["setpriv", f"--reuid={service.pw_uid}", f"--regid={service.pw_gid}", "--clear-groups", "--inh-caps=-all"]
        + [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_unprivileged_worker_runs_a_case_as_its_owner_through_the_sudo_rule(
    sudo_service, settings, link_account, owner, local_pool
):
    """The worker is the service account; its one way to root is the helper's sudo rule. The
    case runs as its owner, comes back with its results, and the helper refuses the same
    service a switch to root."""
    service, command = sudo_service
    settings.GRIDGATE_CASES_ROOT = SUDO_CASES_ROOT
    settings.GRIDGATE_CASE_BACKENDS = {"local": "local"}
    link_account(owner, "gridgate-test1")
    from apps.cases import services

    case = services.create_case(
        owner=owner, resource_class=local_pool.classes.get(), name="c", command="id -u > uid.txt; cat in.txt; echo ok"
    )
    (SUDO_CASES_ROOT / str(case.id) / "inputs" / "in.txt").write_text("input\n")
    for path in [SUDO_CASES_ROOT / str(case.id), *(SUDO_CASES_ROOT / str(case.id)).rglob("*")]:
        os.chown(path, service.pw_uid, service.pw_gid)  # the web (the service) made them
    services.launch_case(case)
    var = SUDO_CASES_ROOT.parent / "var"  # pytest's tmp_path is root's alone
    var.mkdir()
    os.chown(var, service.pw_uid, service.pw_gid)
    db = connection.settings_dict
    env = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "SECRET_KEY": "sudo-test-" + "k" * 40,
        "GRIDGATE_VAR_DIR": str(var),
        "GRIDGATE_CASES_ROOT": str(SUDO_CASES_ROOT),
        "GRIDGATE_PRIVILEGED_COMMAND": command,
        "GRIDGATE_CASE_MIN_UID": "100",
        "GRIDGATE_CASE_BACKENDS": "local=local",
    }
    worker = f"""
import os, time
from apps.cases import passes
from apps.cases.models import Case
assert os.geteuid() != 0
passes.submit_pass(case_ids=["{case.id}"])
for _ in range(600):
    passes.poll_pass(case_ids=["{case.id}"])
    if Case.objects.get(pk="{case.id}").is_terminal:
        break
    time.sleep(0.2)
"""
    ran = as_service(service, worker, env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    case = Case.objects.get(pk=case.id)
    assert case.status == CaseStatus.DONE, case.last_error
    workspace = SUDO_CASES_ROOT / str(case.id)
    assert int((workspace / "results" / "uid.txt").read_text()) == pwd.getpwnam("gridgate-test1").pw_uid
    assert (workspace / "results" / "uid.txt").stat().st_uid == service.pw_uid  # the service's copy
    assert (workspace / "stdout.log").read_text() == "input\nok\n"
    assert not (workspace / ".run" / "work").exists()
    # The same service asks for root: refused by the helper, whatever its request says.
    probe = f"""
from apps.backends import as_root
try:
    as_root.call("start", {{"case_id": "{case.id}", "account": {{"uid": 0}}}}, timeout=60)
except Exception as exc:
    print("REFUSED", exc)
"""
    asked = as_service(service, probe, env)
    assert "REFUSED" in asked.stdout and "root" in asked.stdout, asked.stdout + asked.stderr


# -- review findings ------------------------------------------------------------------------------
def nest(top: Path, depth: int) -> Path:
    """``depth`` nested directories under ``top`` (by fds: the path is too long for one call)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    os.close(fd)
    return top


def test_a_tree_deeper_than_any_walk_is_refused_for_results_and_still_removed(tmp_path):
    """A 3000-level tree raised RecursionError in the walks and rmtree: the fetch failed on every
    retry and clean never removed the tree or the cgroup."""
    settings, case, rdir = prepared_case(tmp_path)
    nest(rdir / "work", 3000)
    with pytest.raises(privileged.TooLarge, match="nested deeper"):
        privileged.collect(settings, {"case_id": case, "what": "results"})
    assert privileged.clean(settings, {"case_id": case}) == {}
    assert not (rdir / "work").exists()


def test_a_second_start_of_a_running_case_changes_nothing_and_is_refused(tmp_path, account):
    settings, case, rdir = prepared_case(tmp_path)
    lock = os.open(rdir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # as a live supervisor holds it
    (rdir / "stdout").write_text("the running case's output")
    request = {"case_id": case, "account": {"uid": account.pw_uid}, "wall_seconds": 1, "disk_interval": 1, "grace": 0}
    try:
        with pytest.raises(privileged.Refused, match="running already"):
            privileged.start(settings, request | {"bounds": BOUNDS})
    finally:
        os.close(lock)
    assert (rdir / "stdout").read_text() == "the running case's output"
    assert (rdir / "work").stat().st_uid == os.geteuid()  # not handed over either


def test_an_administrator_account_is_never_switched_to(tmp_path, sandbox_host):
    try:
        group = grp.getgrnam("adm")
    except KeyError:
        pytest.skip("no adm group on this host")
    member = sandbox_host["gridgate-test2"]
    subprocess.run(["usermod", "-aG", "adm", member.pw_name], check=True)
    try:
        with pytest.raises(privileged.Refused, match="administrator"):
            privileged.account(config(tmp_path), {"account": {"uid": member.pw_uid}})
    finally:
        subprocess.run(["gpasswd", "-d", member.pw_name, group.gr_name], capture_output=True)


def test_collecting_skips_a_file_the_cases_account_does_not_own(tmp_path, account):
    """On a shared file system the account could move into work/ another account's file (from a
    directory both may write): it is not brought back."""
    settings, case, rdir = prepared_case(tmp_path)
    work = rdir / "work"
    (work / "mine.txt").write_text("mine")
    (work / "theirs.txt").write_text("someone else's")
    for path in (work, work / "mine.txt"):
        os.chown(path, account.pw_uid, account.pw_gid)
    os.chown(work / "theirs.txt", pwd.getpwnam("daemon").pw_uid, 0)
    assert privileged.collect(settings, {"case_id": case, "what": "results"}) == {"copied": ["mine.txt"]}
