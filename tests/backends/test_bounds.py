"""A local case reaches nothing but its workspace, and no more of the host than its class gives it.
Each test is one attack on those bounds, run as a real case in bubblewrap as a linked account
(root, bwrap, slirp4netns; required under CI)."""

import json
import os
import shutil
import socket
import subprocess
import threading
import tracemalloc
import uuid
from pathlib import Path

import pytest

from apps.backends import as_root, privileged
from apps.backends.local import LocalBackend, run_dir
from apps.cases import passes, workspace
from apps.cases.models import CaseStatus
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.conftest import _required_or_skip, wait_for_terminal, wait_until
from tests.cases.conftest import launched

pytestmark = [pytest.mark.django_db, pytest.mark.sandbox]

GiB = 1 << 30


@pytest.fixture(autouse=True)
def owner_linked(link_account, owner):
    return link_account(owner)


@pytest.fixture(scope="module", autouse=True)
def slirp4netns():
    if shutil.which("slirp4netns") is None:
        _required_or_skip("slirp4netns is not installed (apt install slirp4netns)")


@pytest.fixture
def bounded(settings):
    """``bounded(**class_fields)``: a class of a fresh local pool with these bounds."""
    settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS = 1
    settings.GRIDGATE_CASE_DISK_CHECK_SECONDS = 1

    def make(network=False, **fields):
        pool = ResourcePool.objects.create(name=f"bounded-{ResourcePool.objects.count()}", kind="local", public=True)
        pool.network = network
        pool.save()
        fields.setdefault("memory", 1)
        return ResourceClass.objects.create(pool=pool, name="c", cpu=1, default=True, **fields)

    return make


def run(make_case, resource_class, command, **kwargs):
    case = launched(make_case(resource_class=resource_class, command=command), **kwargs)
    assert case.status == CaseStatus.PENDING, case.last_error
    return wait_for_terminal(case, timeout=120)


def result(case, name) -> str:
    return (workspace.case_dir(case.id) / "results" / name).read_text()


class Listener:
    """A TCP server on ``address`` that answers every connection with a word."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        self.sock.bind((address, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.sendall(b"reached")
            conn.close()

    def close(self):
        self.sock.close()


PROBE = """python3 - <<'EOF' > reach.json
import json, socket
out = {}
for host, port in %s:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            out[f"{host}:{port}"] = s.recv(16).decode() or "open"
    except OSError as exc:
        out[f"{host}:{port}"] = type(exc).__name__
print(json.dumps(out))
EOF
"""


def external_address() -> str | None:
    """An address of this host that is not loopback (the one a default route leaves by)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.123", 9))  # no packet is sent: it only picks the outgoing address
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_a_case_reaches_no_service_on_the_hosts_loopback(make_case, bounded):
    """The host's loopback: psql, Redis and the web port on 127.0.0.1 from inside a case of a
    pool left at its default (no network)."""
    web = Listener("127.0.0.1")
    try:
        targets = [("127.0.0.1", 5432), ("127.0.0.1", 6379), ("127.0.0.1", web.port), ("::1", 6379)]
        rc = bounded()
        assert rc.pool.network is False  # the default
        command = PROBE % targets + "psql -h 127.0.0.1 -U postgres -c 'select 1' > psql.txt 2>&1; true"
        case = run(make_case, rc, command)
    finally:
        web.close()
    assert case.status == CaseStatus.DONE, case.last_error
    reach = json.loads(result(case, "reach.json"))
    assert set(reach) == {f"{h}:{p}" for h, p in targets}
    assert not any(outcome in ("reached", "open") for outcome in reach.values()), reach
    assert "select" not in result(case, "psql.txt") and "1 row" not in result(case, "psql.txt")


@pytest.fixture
def test_hosts():
    """Test hosts in a network namespace of this run's own, behind a veth pair: 198.51.100.2 (a
    public address, TEST-NET-2), 10.199.0.2 (a private one) and 169.254.169.254 (where clouds serve
    instance metadata), each answering "reached" on one port. The routes are checked before any
    case runs, so nothing of this test ever leaves the machine."""
    tag = uuid.uuid4().hex[:6]
    ns, outer, inner = f"gg-{tag}", f"gg{tag}a", f"gg{tag}b"
    addresses = {"public": "198.51.100.2", "private": "10.199.0.2", "metadata": "169.254.169.254"}

    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    ip("netns", "add", ns)
    server = None
    try:
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", ns)
        ip("addr", "add", "198.51.100.1/30", "dev", outer)
        ip("link", "set", outer, "up")
        ip("-n", ns, "addr", "add", "198.51.100.2/30", "dev", inner)
        ip("-n", ns, "link", "set", inner, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "route", "add", "default", "via", "198.51.100.1")
        for name in ("private", "metadata"):
            ip("-n", ns, "addr", "add", f"{addresses[name]}/32", "dev", "lo")
            ip("route", "add", f"{addresses[name]}/32", "via", "198.51.100.2")
        for address in addresses.values():
            route = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=True).stdout
            assert f"dev {outer}" in route, route  # never the machine's own way out
        serve = (
            "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('0.0.0.0', 8047)); s.listen(16); print('up', flush=True)\n"
            "while True:\n    c, _ = s.accept(); c.sendall(b'reached'); c.close()\n"
        )
        server = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", serve], stdout=subprocess.PIPE)
        assert server.stdout.readline().strip() == b"up"
        yield {name: (address, 8047) for name, address in addresses.items()}
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", outer], capture_output=True, check=False)
        for name in ("private", "metadata"):
            subprocess.run(["ip", "route", "del", f"{addresses[name]}/32"], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def run_networked(make_case, resource_class, command):
    """``run``, once more when the sandbox was gone before its egress filter could be loaded:
    seen in about one full CI run in two (the filter's ``nsenter`` finds no /proc/<pid>, the case
    fails closed, as it must); its cause is not found yet, and the second run must prove the
    filter all the same."""
    case = run(make_case, resource_class, command)
    if case.status == CaseStatus.FAILED and "egress filter could not be set up" in case.last_error:
        case = run(make_case, resource_class, command)
    return case


def test_a_networked_case_reaches_public_addresses_only_unless_its_pool_lists_more(make_case, bounded, test_hosts):
    """F5: a case with the network reached the host's other addresses and 169.254.169.254 (only
    loopback was kept out). Its own network namespace now drops link-local, private (RFC 1918),
    CGNAT and the host's own addresses, unless the pool lists them in allowed_networks."""
    address = external_address()
    if address is None:
        pytest.fail("this host has no non-loopback address to test an outgoing connection with")
    host_service, inside = Listener(address), Listener("127.0.0.1")
    try:
        targets = [
            test_hosts["public"],
            test_hosts["private"],
            test_hosts["metadata"],
            (address, host_service.port),
            ("127.0.0.1", inside.port),
            ("10.0.2.2", inside.port),
            ("127.0.0.1", 5432),
        ]
        case = run_networked(make_case, bounded(network=True), PROBE % targets)
        assert case.status == CaseStatus.DONE, case.last_error
        reach = json.loads(result(case, "reach.json"))
        assert reach.pop("198.51.100.2:8047") == "reached"  # the network works
        assert not any(outcome in ("reached", "open") for outcome in reach.values()), reach

        wider = bounded(network=True)
        wider.pool.allowed_networks = "10.199.0.0/30"
        wider.pool.full_clean()
        wider.pool.save()
        case = run_networked(make_case, wider, PROBE % targets[:3])
        assert case.status == CaseStatus.DONE, case.last_error
        reach = json.loads(result(case, "reach.json"))
        assert reach["10.199.0.2:8047"] == "reached" and reach["169.254.169.254:8047"] != "reached", reach
    finally:
        host_service.close()
        inside.close()


def test_doctor_fails_a_networked_pool_whose_cases_get_no_egress_filter(bounded, monkeypatch):
    """F5: doctor checks the egress filter for pools with the network (the helper loads a
    filter into a fresh network namespace), and fails when it cannot."""
    pool = bounded(network=True).pool
    check = next(c for c in LocalBackend().doctor(pool) if c.name == "egress filter")
    assert check.ok, check.message
    assert not any(c.name == "egress filter" for c in LocalBackend().doctor(bounded().pool))
    real = as_root.call

    def without_nft(verb, request, **kw):
        if request.get("probe_egress"):
            return {"egress": "nftables (nft) is not installed: apt install nftables"}
        return real(verb, request, **kw)

    monkeypatch.setattr(as_root, "call", without_nft)
    check = next(c for c in LocalBackend().doctor(pool) if c.name == "egress filter")
    assert not check.ok and "apt install nftables" in check.message


USERNS_PROBE = """grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status > caps.txt
unshare --user true 2> unshare.txt && echo created > userns.txt || echo refused > userns.txt
python3 - <<'EOF' > clone.txt
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
pid = libc.syscall(56, CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)  # clone(2) on x86_64
if pid == 0:
    os._exit(0)
print("created" if pid > 0 else f"refused {os.strerror(ctypes.get_errno())}")
if pid > 0:
    os.waitpid(pid, 0)
EOF
"""


def test_a_case_cannot_make_a_user_namespace_and_holds_no_capability_even_bounded(make_case, bounded):
    """F6: a case could create user namespaces (unshare -U: a fresh set of capabilities over a
    namespace of its own, the way into many kernel bugs), and its capability bounding set was
    not cleared (setpriv cannot clear it without CAP_SETPCAP), though the docs said so. A seccomp
    filter now refuses unshare(2) and clone(2) with CLONE_NEWUSER (and clone3, so libc falls back
    to clone), and every capability set is empty."""
    case = run(make_case, bounded(), USERNS_PROBE)
    assert case.status == CaseStatus.DONE, case.last_error
    caps = dict(line.split(":\t") for line in result(case, "caps.txt").split("\n") if line)
    assert caps == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), "0000000000000000"), caps
    assert result(case, "userns.txt").strip() == "refused", result(case, "unshare.txt")
    assert result(case, "clone.txt").startswith("refused"), result(case, "clone.txt")


@pytest.mark.parametrize(
    ("bounds", "command", "words"),
    [
        # 2 GB in a 1 GB class: the kernel kills the allocation, and the case fails even though
        # the shell's last command succeeded (as Slurm's OUT_OF_MEMORY).
        ({"memory": 1}, "python3 -c 'x = bytearray(2 * 1024 ** 3)'; echo survived", ["ran out of memory", "1 GB"]),
        ({"max_tasks": 100}, "for i in $(seq 500); do sleep 60 & done; wait", ["limit of 100 tasks"]),
        ({"wall_time": 2, "max_wall_time": 60}, "sleep 300", ["wall time of 0:00:02"]),
        ({"max_storage": 1}, "fallocate -l 700M a; fallocate -l 700M b; sleep 300", ["storage of 1 GB"]),
    ],
    ids=["memory", "tasks", "wall-time", "storage"],
)
def test_a_case_past_a_class_bound_is_stopped_and_fails_saying_which(make_case, bounded, bounds, command, words):
    case = run(make_case, bounded(**bounds), command)
    assert case.status == CaseStatus.FAILED
    assert all(word in case.last_error for word in words), case.last_error


def test_the_wall_time_launch_option_is_taken_within_the_class_maximum(make_case, bounded):
    """The ``time`` option (minutes) replaces the class's default wall time."""
    rc = bounded(wall_time=2, max_wall_time=600)
    case = launched(make_case(resource_class=rc, command="sleep 4; echo done"), launch_options={"time": "10"})
    case = wait_for_terminal(case, timeout=120)
    assert case.status == CaseStatus.DONE, case.last_error  # past the class's 2 s: the option's 10 min


def test_a_sparse_file_comes_back_sparse(make_case, bounded):
    """An 8 GiB sparse file: it stores nothing, and its result stores nothing either."""
    case = run(make_case, bounded(max_storage=10, default_storage=1), "truncate -s 8G sparse.bin; echo x > real.txt")
    assert case.status == CaseStatus.DONE, case.last_error
    copy = workspace.case_dir(case.id) / "results" / "sparse.bin"
    assert copy.stat().st_size == 8 * GiB
    assert copy.stat().st_blocks * 512 < 1 << 20
    assert result(case, "real.txt") == "x\n"


def test_a_gigabyte_of_stdout_is_drained_in_chunks_and_kept_up_to_the_log_cap(make_case, bounded, settings):
    """1 GiB of output: the worker's poll holds a chunk of it at a time, never the gigabyte, and
    the workspace keeps GRIDGATE_CASE_MAX_LOG_MB of it with a note."""
    settings.GRIDGATE_CASE_MAX_LOG_MB = 8
    rc = bounded(max_storage=2)
    case = launched(make_case(resource_class=rc, command="yes | head -c 1073741824"))
    rdir = run_dir(workspace.case_dir(case.id))
    wait_until((rdir / "exit_status").exists, timeout=120, what="the command's end")
    assert (rdir / "stdout").stat().st_size == GiB
    tracemalloc.start()
    try:
        passes.poll_pass(case_ids=[case.id])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    case.refresh_from_db()
    assert case.status == CaseStatus.DONE, case.last_error
    assert peak < 16 << 20, f"the poll held {peak / 2**20:.0f} MiB at once"
    log = workspace.case_dir(case.id) / "stdout.log"
    assert log.read_bytes().endswith(b"the rest was not kept]\n")
    assert log.stat().st_size < (8 << 20) + 200


def test_the_command_is_in_no_command_line_on_the_host(make_case, bounded):
    """Every account on the host reads every command line (/proc/*/cmdline, ps): the case's
    command (here a 'secret' passed as an argument) is never one of them."""
    marker = f"secret-{os.getpid()}-4711"
    case = launched(make_case(resource_class=bounded(), command=f"echo {marker} > seen.txt; sleep 3"))
    rdir = run_dir(workspace.case_dir(case.id))
    wait_until(lambda: (rdir / "work" / "seen.txt").exists(), what="the command running")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                assert marker.encode() not in Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (rdir / "command.sh").stat().st_mode & 0o777 == 0o600


def test_the_command_holds_no_file_descriptor_but_its_standard_ones(make_case, bounded):
    """Review finding: the host directories bound into the sandbox were also open fds of the
    command, and ``openat(fd, "..")`` walks the host's tree from one. Nothing but 0, 1, 2 (and
    the listing's own) is open when the command starts."""
    case = run(make_case, bounded(), "ls /proc/self/fd > fds.txt")
    assert case.status == CaseStatus.DONE, case.last_error
    assert set(result(case, "fds.txt").split()) <= {"0", "1", "2", "3"}


def test_the_cases_variables_are_set_after_the_switch_never_for_root(sandbox_host, tmp_path):
    """Review finding: the case's variables were bwrap's --setenv, i.e. the environment of the
    root setpriv inside the sandbox, so an LD_PRELOAD among them (a compromised service chooses
    them) ran as root. Root's steps get an empty environment and only the capabilities setpriv needs; the
    variables are set by env -i after the switch."""
    entry = sandbox_host["gridgate-test1"]
    config = privileged.Config(cases_root=str(tmp_path), service_uid=0, service_gid=0)
    argv = privileged.sandbox_argv(
        config, "c", entry, {"LD_PRELOAD": "/evil.so"}, network=False, shared=False, tmp_bytes=GiB
    )
    assert "--setenv" not in argv and "--clearenv" in argv
    switch = argv.index("/usr/bin/setpriv")
    assert argv[switch - 9 : switch - 1] == [
        "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"
    ]  # fmt: skip
    assert argv.index("LD_PRELOAD=/evil.so") > argv.index("--", switch)
    assert argv[argv.index("--", switch) + 1 : argv.index("--", switch) + 3] == ["/usr/bin/env", "-i"]


def test_tmp_is_private_and_no_larger_than_the_class_memory(make_case, bounded):
    case = run(make_case, bounded(memory=1), "df -B1 --output=size /tmp | tail -n 1 > tmp.txt")
    assert case.status == CaseStatus.DONE, case.last_error
    assert int(result(case, "tmp.txt")) == GiB


def test_the_cases_cgroup_holds_the_class_bounds_and_is_gone_once_it_ends(make_case, bounded, settings):
    rc = bounded(memory=1, max_tasks=64)
    rc.cpu = "0.5"
    rc.save()
    case = launched(make_case(resource_class=rc, command="sleep 3"))
    unified, v1 = privileged._mounts()
    root = privileged._v2_root(unified)
    mounts = [root] if root else [v1[c] for c in privileged.CONTROLLERS if c in v1]
    dirs = [Path(mount, settings.GRIDGATE_CASE_CGROUP, f"case-{case.id}") for mount in mounts]
    assert dirs and all(d.is_dir() for d in dirs)
    limits = {}
    for directory in dirs:
        for name in ("memory.max", "memory.limit_in_bytes", "pids.max", "cpu.max", "cpu.cfs_quota_us"):
            if (directory / name).exists():
                limits[name] = (directory / name).read_text().split()[0]
    assert limits.get("memory.max", limits.get("memory.limit_in_bytes")) == str(GiB)
    assert limits["pids.max"] == "64"
    assert limits.get("cpu.max", limits.get("cpu.cfs_quota_us")) == "50000"  # half a core
    assert all(d.name == f"case-{case.id}" for d in dirs)
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE, case.last_error
    assert not any(d.exists() for d in dirs)


def test_a_cgroup_v2_hierarchy_gets_the_bounds_and_hands_the_controllers_down(tmp_path, monkeypatch):
    """The unified hierarchy (most hosts today; CI's is v1): the file names differ, and each
    ancestor must enable the controllers for its children."""
    for directory in (tmp_path, tmp_path / "gridgate"):
        directory.mkdir(exist_ok=True)
        (directory / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (directory / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(privileged, "_mounts", lambda: (str(tmp_path), {}))
    leaf = tmp_path / "gridgate" / "case-x"
    leaf.mkdir()
    for name in ("memory.swap.max", "cpu.max"):
        (leaf / name).write_text("max\n")
    cgroup = privileged.create_cgroup("gridgate", "case-x", memory_bytes=GiB, tasks=100, cpu=0.5)
    assert cgroup == {"version": 2, "dirs": {"unified": str(leaf)}}
    assert (leaf / "memory.max").read_text() == f"{GiB}\n"
    assert (leaf / "memory.swap.max").read_text() == "0\n"
    assert (leaf / "pids.max").read_text() == "100\n"
    assert (leaf / "cpu.max").read_text() == "50000 100000\n"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids +cpu\n"
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (leaf / "pids.events").write_text("max 0\n")
    watched = privileged.Cgroup(**cgroup)
    assert watched.oom_kills() == 1 and watched.forks_refused() == 0
