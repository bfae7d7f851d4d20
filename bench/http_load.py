"""HTTP throughput of the production server (SPEC §9).

Starts what `make run` starts (gunicorn with config/gunicorn.conf.py) on a PostgreSQL bench
database, then drives 8 and 32 concurrent keep-alive clients (processes) for a fixed time per
scenario, over REST with a static token ("rest"), REST with the identity provider's JWT as a bearer
token ("jwt": signed by a loopback issuer whose keys the server reads once, issue 33), and QRMI
(real MUNGE credentials, all made with `munge -n` before the timed window):

- floor:   an authenticated request through the same stack that runs one SELECT
           (REST: GET /api/v1/ with a token; QRMI: the same with X-Munge-Cred instead)
- write floor: an authenticated request through the same stack that inserts one small row and
           commits, durably (REST: POST /api/v1/bench/write-floor/ with a token; QRMI: the same
           with X-Munge-Cred), into a table the bench creates in its database and drops after.
           The route exists only with GRIDGATE_BENCH_WRITE_FLOOR=true, which the bench sets for
           its own server: it is no feature of the product.
- cycles:  acquire + release of a session (REST POST/DELETE /api/v1/sessions/,
           QRMI POST sessions + DELETE sessions/<id> as the SPANK plugin's root uid)
- submits: job submissions into the client's own session (Pulser sequence, emulator pool), the
           same sequence every time (what Pulser's QRMI connection sends for each entry of a
           job's job_params: R-DEV-1's check of it is remembered after the first)
- distinct: the same, with a sequence never sent before on every submission (a parameter
           sweep: every submission pays R-DEV-1's Pulser check)

Each scenario's time is cut into BENCH_HTTP_ROUNDS rounds (default 5), the scenarios taking turns
in each, so that the machine's drift hits the floors and the figures alike. Both floors are
measured in every round, over both protocols. The write floor is printed with its ratio to the
floor; each write figure (cycles, submits, distinct) with its ratios per request (a cycle is 2
requests) to the floor and to the write floor of the same rounds, each with the spread of its
per-round ratios (the target, SPEC §9: acquire+release and submission each >= 0.50 of the write
floor per request); all with p50/p95/p99, errors, and the SQL statements of one such request
counted in-process through the same code. Environment: BENCH_HTTP_SECONDS (default
10: per scenario, all rounds together), BENCH_HTTP_CLIENTS
(default "8,32"), GRIDGATE_WEB_WORKERS / GRIDGATE_WEB_THREADS (the server's, as in production),
BENCH_HTTP_SERVER=granian to measure granian's WSGI server with the same processes x threads,
BENCH_HTTP_PROTOCOLS ("rest,qrmi") and BENCH_HTTP_KINDS ("cycles,submits,distinct") for a quicker
A/B of a part (both floors are always measured).

Every acquire, release and submission ends with a commit that waits for PostgreSQL's WAL to reach
the disk; the floor writes nothing, and the write floor waits for that flush and does nothing
else, which is why write figures are judged against it. On a virtual disk whose fdatasync() now
and then takes tens or hundreds of milliseconds, every client waits on the same flush and those
rounds stall, whatever the application does. So the run also prints what the disk did meanwhile: the latency of an 8 kB
write + fdatasync() every 50 ms on the filesystem of PostgreSQL's WAL while the rounds of each
client count run (``DiskProbe``).
BENCH_HTTP_SYNC_COMMIT=off measures the same with the bench database's
``synchronous_commit = off`` (commits stop waiting for the flush: not durable, never a
deployment setting), which leaves the application's and PostgreSQL's CPU alone in the figures.
"""

import http.client
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import ROOT, django_on_bench_database, percentile  # noqa: E402

SECONDS = float(os.environ.get("BENCH_HTTP_SECONDS", "10"))
CLIENTS = [int(n) for n in os.environ.get("BENCH_HTTP_CLIENTS", "8,32").split(",")]
UID = 65534  # "nobody": exists everywhere, so munge accepts credentials made for it (as root)
POOL = "bench-http"
SERVER = os.environ.get("BENCH_HTTP_SERVER", "gunicorn")  # what make run uses; "granian" to compare
WARMUP = float(os.environ.get("BENCH_HTTP_WARMUP", "3"))
PROTOCOLS = os.environ.get("BENCH_HTTP_PROTOCOLS", "rest,jwt,qrmi").split(",")  # "rest" for a quicker A/B
CRED_RATE = 400  # credentials made per client-second of QRMI load: more than the server can use
# BENCH_HTTP_KINDS="cycles" for a quicker A/B of one figure (both floors are always measured).
MEASURED = os.environ.get("BENCH_HTTP_KINDS", "cycles,submits,distinct").split(",")
FLOORS = ("floor", "write_floor")
KINDS = (*FLOORS, *(kind for kind in MEASURED if kind not in FLOORS))
UNITS = {
    "floor": "req/s",
    "write_floor": "req/s",
    "cycles": "cycles/s",
    "submits": "submissions/s",
    "distinct": "submissions/s",
}
WRITE_FLOOR = "/api/v1/bench/write-floor/"
# Each scenario's time is cut into rounds, the kinds taking turns within each round: this machine's
# speed drifts by a third within minutes, and a floor measured once, minutes before a figure,
# moved every ratio with it. Each ratio is then the figure over the floor of the same rounds.
ROUNDS = int(os.environ.get("BENCH_HTTP_ROUNDS", "5"))
START_MARGIN = 0.5  # seconds for a window's contexts (credentials, sequences) to reach its clients
SYNC_COMMIT = os.environ.get("BENCH_HTTP_SYNC_COMMIT", "on")  # "off": a diagnostic, see the docstring


def munge_batch(uid: int, count: int) -> list[str]:
    """``count`` fresh credentials of ``uid`` (each decodes once: munged refuses replays)."""
    command = ["munge", "--no-input"]
    if uid != os.getuid():
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]

    def one(_):
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout.strip()

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method, path, headers, body=None):
        data = json.dumps(body).encode() if body is not None else None
        headers = {**headers, **({"Content-Type": "application/json"} if data else {})}
        try:
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            return 599, b""
        return response.status, payload


def scenario_worker(args):
    """One client: from ``start`` on, run its scenario until the deadline; return (latencies of
    successes, errors, end)."""
    kind, proto, port, start, deadline, ctx = args
    time.sleep(max(0.0, start - time.monotonic()))
    client = Client(port)
    creds = iter(ctx.get("creds", []))
    creds_user = iter(ctx.get("creds_user", []))
    distinct = iter(ctx.get("distinct", []))
    latencies, errors = [], 0

    def munge(it):
        return {"X-Munge-Cred": next(it)}

    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        try:
            if kind == "floor":
                headers = ctx["auth"] if proto != "qrmi" else munge(creds_user)
                ok = client.call("GET", "/api/v1/", headers)[0] == 200
            elif kind == "write_floor":
                headers = ctx["auth"] if proto != "qrmi" else munge(creds_user)
                ok = client.call("POST", WRITE_FLOOR, headers)[0] == 204
            elif kind == "cycles" and proto != "qrmi":
                status, body = client.call(
                    "POST", "/api/v1/sessions/", ctx["auth"], {"resource_class": ctx["class_id"], "slots": 1}
                )
                ok = status == 201
                if ok:
                    sid = json.loads(body)["id"]
                    ok = client.call("DELETE", f"/api/v1/sessions/{sid}/", ctx["auth"])[0] == 204
            elif kind == "cycles":
                status, body = client.call(
                    "POST", f"/qrmi/{POOL}/sessions", munge(creds), {"user_id": str(UID), "qpu_slots": 1}
                )
                ok = status == 201
                if ok:
                    sid = json.loads(body)["id"]
                    ok = client.call("DELETE", f"/qrmi/{POOL}/sessions/{sid}", munge(creds))[0] == 200
            else:
                sequence = next(distinct) if kind == "distinct" else ctx["sequence"]
                if proto != "qrmi":
                    body = {"payload": {"sequence": sequence}, "shots": 10}
                    ok = client.call("POST", f"/api/v1/sessions/{ctx['session']}/jobs/", ctx["auth"], body)[0] == 201
                else:
                    headers = {**munge(creds_user), "X-Warden-Session": ctx["session"]}
                    body = {"sequence": sequence, "shots": 10}
                    ok = client.call("POST", f"/qrmi/{POOL}/jobs", headers, body)[0] == 200
        except StopIteration:
            break  # out of pre-made credentials: the window ends early for this client
        if ok:
            latencies.append(time.perf_counter() - t0)
        else:
            errors += 1
    return latencies, errors, time.monotonic()


def run_scenario(pool, kind, proto, port, contexts, seconds):
    """One timed window of ``kind`` with one client process per context (``pool``'s, forked
    before): every client starts at the same moment, after the contexts reached them.
    Returns (latencies of successes, errors, seconds)."""
    start = time.monotonic() + START_MARGIN
    deadline = start + seconds
    results = pool.map(scenario_worker, [(kind, proto, port, start, deadline, ctx) for ctx in contexts], chunksize=1)
    latencies = [value for lat, _, _ in results for value in lat]
    errors = sum(err for _, err, _ in results)
    return latencies, errors, max(end for _, _, end in results) - start


class DiskProbe(threading.Thread):
    """An 8 kB write + fdatasync() every 50 ms in ``directory``, until stopped: what a commit's
    WAL flush waits for on that filesystem meanwhile (its latencies, in seconds, in ``waits``)."""

    INTERVAL = 0.05

    def __init__(self, directory: Path):
        super().__init__(daemon=True)
        self.path = directory / f"disk-probe-{os.getpid()}"
        self.waits: list[float] = []
        self.stopping = threading.Event()

    def run(self):
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while not self.stopping.wait(self.INTERVAL):
                t0 = time.perf_counter()
                os.pwrite(fd, b"\0" * 8192, 0)
                os.fdatasync(fd)
                self.waits.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
            self.path.unlink(missing_ok=True)

    def stop(self) -> str:
        self.stopping.set()
        self.join()
        waits = self.waits
        if not waits:
            return "no sample"
        ms = [percentile(waits, p) * 1000 for p in (50, 99)]
        slow = sum(wait >= 0.05 for wait in waits)
        return (
            f"fdatasync p50 {ms[0]:.2f} ms, p99 {ms[1]:.1f} ms, max {max(waits) * 1000:.0f} ms, "
            f"{slow} of {len(waits)} >= 50 ms"
        )


def wal_directory(conninfo: str) -> tuple[Path, str]:
    """Where the disk probe writes: the bench's own directory (var/), said to be on PostgreSQL's
    WAL filesystem when it is (same device as ``pg_wal``; PostgreSQL on this host)."""
    import psycopg

    here = ROOT / "var"
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            data = conn.execute("SHOW data_directory").fetchone()[0]
        same = os.stat(Path(data) / "pg_wal").st_dev == os.stat(here).st_dev
    except (psycopg.Error, OSError):  # another host, or not allowed to look
        return here, "var/ (PostgreSQL's WAL disk not visible from here)"
    return here, "var/, PostgreSQL's WAL filesystem" if same else "var/ (not PostgreSQL's WAL filesystem)"


def rate_of(rounds) -> float:
    """Successes per second over ``rounds`` [(successes, seconds)]."""
    seconds = sum(elapsed for _, elapsed in rounds)
    return sum(count for count, _ in rounds) / seconds if seconds else 0.0


def ratio_to(rounds, floor_rounds, requests=1) -> str:
    """Requests per second of ``rounds`` (``requests`` per success: a cycle is 2) over the floor's
    of the same rounds, and the spread of the per-round ratios."""
    whole = requests * rate_of(rounds) / (rate_of(floor_rounds) or float("nan"))
    by_round = sorted(
        requests * rate_of([r]) / (rate_of([f]) or float("nan")) for r, f in zip(rounds, floor_rounds, strict=True)
    )
    return f"{whole:.2f} (rounds {by_round[0]:.2f}-{by_round[-1]:.2f})"


def statements_per_request(token_key, class_id, session_id, sequence, root_creds, user_creds):
    """SQL statements of one request of each kind, counted in-process through the same code.
    Returns {kind: (work statements, with BEGIN/COMMIT)}."""
    from django.db import connection
    from django.test import Client as DjangoClient
    from django.test.utils import CaptureQueriesContext

    client = DjangoClient(HTTP_AUTHORIZATION=f"Token {token_key}")
    client.get("/api/v1/")  # the token's first use in a minute records it: counted apart from requests
    counts = {}

    def count(label, call):
        with CaptureQueriesContext(connection) as captured:
            response = call()
        sqls = [q["sql"] for q in captured.captured_queries]
        work = [s for s in sqls if not s.startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"))]
        counts[label] = (len(work), len(sqls), response.status_code)
        return response

    count("floor (REST)", lambda: client.get("/api/v1/"))
    count("write floor (REST)", lambda: client.post(WRITE_FLOOR))
    created = count(
        "acquire (REST)",
        lambda: client.post("/api/v1/sessions/", {"resource_class": class_id}, content_type="application/json"),
    )
    sid = created.json()["id"]
    count("release (REST)", lambda: client.delete(f"/api/v1/sessions/{sid}/"))

    def rest_submit():
        return client.post(
            f"/api/v1/sessions/{session_id}/jobs/",
            {"payload": {"sequence": sequence}, "shots": 10},
            content_type="application/json",
        )

    # The first submission into an idle pool also wakes the dispatcher (once: R-SCHED-5's
    # coalesced wake-up); the ones after it are the common path the budget is about.
    count("submit (REST, wakes)", rest_submit)
    count("submit (REST)", rest_submit)
    q = DjangoClient()
    creds, user = iter(root_creds), iter(user_creds)
    count("floor (QRMI stack)", lambda: q.get("/api/v1/", HTTP_X_MUNGE_CRED=next(user)))
    count("write floor (QRMI)", lambda: q.post(WRITE_FLOOR, HTTP_X_MUNGE_CRED=next(user)))
    created = count(
        "acquire (QRMI)",
        lambda: q.post(
            f"/qrmi/{POOL}/sessions",
            {"user_id": str(UID)},
            content_type="application/json",
            HTTP_X_MUNGE_CRED=next(creds),
        ),
    )
    qsid = created.json()["id"]
    count("release (QRMI)", lambda: q.delete(f"/qrmi/{POOL}/sessions/{qsid}", HTTP_X_MUNGE_CRED=next(creds)))
    count(
        "submit (QRMI)",
        lambda: q.post(
            f"/qrmi/{POOL}/jobs",
            {"sequence": sequence, "shots": 10},
            content_type="application/json",
            HTTP_X_MUNGE_CRED=next(user),
            HTTP_X_WARDEN_SESSION=session_id,
        ),
    )
    return counts


def sequence_repr() -> str:
    import pulser.devices
    from pulser import Pulse, Register, Sequence

    sequence = Sequence(Register.rectangle(1, 2, spacing=8, prefix="q"), pulser.devices.AnalogDevice)
    sequence.declare_channel("rydberg", "rydberg_global")
    sequence.add(Pulse.ConstantPulse(500, 2.0, 0.0, 0.0), "rydberg")
    sequence.measure("ground-rydberg")
    return sequence.to_abstract_repr()


def distinct_sequences(sequence: str, start: int, count: int) -> list[str]:
    """``count`` variants of ``sequence`` that differ from each other and from every other
    client's (their pulse's amplitude), as a sweep over a parameter sends them."""
    template = json.loads(sequence)
    variants = []
    for i in range(start, start + count):
        template["operations"][0]["amplitude"]["value"] = 2.0 - (i + 1) * 1e-7  # never the 2.0 of `submits`
        variants.append(json.dumps(template))
    return variants


def set_sync_commit(conninfo: str, value: str) -> None:
    """The bench database's default ``synchronous_commit`` (its own database: nothing else
    reads it); "on" restores the server's."""
    import psycopg

    name = conninfo.rsplit("/", 1)[1]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if value == "on":
            conn.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')
        else:
            conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')


def main() -> int:
    if SYNC_COMMIT not in ("on", "off"):
        print(f"http_load: BENCH_HTTP_SYNC_COMMIT must be on or off, not {SYNC_COMMIT!r}")
        return 2
    unknown = [kind for kind in KINDS if kind not in UNITS]
    if unknown:
        choices = ", ".join(kind for kind in UNITS if kind not in FLOORS)
        print(f"http_load: BENCH_HTTP_KINDS names no figure {unknown}: choose from {choices}")
        return 2
    if subprocess.run(["sh", "-c", "command -v munge"], capture_output=True).returncode:
        print("http_load: skipped (munge is not installed: scripts/munge-local.sh start)")
        return 0
    subprocess.run([str(ROOT / "scripts/munge-local.sh"), "start"], capture_output=True)
    # The write floor's route, here and in the server started below (which inherits the environment).
    os.environ.update(DEBUG="false", ALLOWED_HOSTS="127.0.0.1,testserver", GRIDGATE_BENCH_WRITE_FLOOR="true")
    conninfo = django_on_bench_database(os.environ.get("GRIDGATE_BENCH_HTTP_DB", "gridgate_bench_http"))
    if conninfo is None:
        print("http_load: skipped (needs PostgreSQL: set DATABASE_URL or start it on 127.0.0.1:5432)")
        return 0
    from django.contrib.auth import get_user_model

    from apps.accounts.models import Identity
    from apps.accounts.services import issue_token
    from apps.core.api.views import WRITE_FLOOR_TABLE, WRITE_FLOOR_TABLE_SQL
    from apps.qrmi.models import UnixAccount
    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling.models import Device, Job
    from apps.sessions import services
    from apps.sessions.models import Session
    from tests.doubles.jwks_server import Issuer

    Job.objects.filter(pool__name=POOL).delete()
    Session.objects.filter(pool__name=POOL).delete()
    ResourcePool.objects.filter(name=POOL).delete()
    pool = ResourcePool.objects.create(name=POOL, kind="local", public=True, slots_total=1_000_000)
    klass = ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="emu", driver="emulator", config={"pulser_device": "AnalogDevice"})
    user, _ = get_user_model().objects.get_or_create(username="bench-http")
    UnixAccount.objects.update_or_create(user=user, defaults={"unix_uid": UID})
    _, key = issue_token(user, name="bench http_load")
    auth = {"Authorization": f"Token {key}"}
    # The identity provider's keys, served on loopback for the server to read; the same user's
    # identity there, and a JWT valid for the whole run.
    issuer = Issuer().start()
    Identity.objects.update_or_create(issuer=issuer.url, subject="bench-http", defaults={"user": user})
    os.environ.update(
        GRIDGATE_OIDC_ISSUER=issuer.url,
        GRIDGATE_OIDC_JWKS_ENDPOINT=f"{issuer.url}/jwks",
        GRIDGATE_OIDC_CLIENT_ID="gridgate",
    )
    bearer_auth = {"Authorization": f"Bearer {issuer.token(sub='bench-http', lifetime=6 * 3600)}"}
    sequence = sequence_repr()
    max_clients = max(CLIENTS)
    sessions = [
        str(services.admit(user=user, resource_class=klass, slots=1).session.pk) for _ in range(max_clients + 1)
    ]
    from django.db import connection, connections

    # Afresh: a run that died before its drop leaves its rows behind.
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {WRITE_FLOOR_TABLE}")
        cursor.execute(WRITE_FLOOR_TABLE_SQL)
    counts = statements_per_request(key, klass.pk, sessions[-1], sequence, munge_batch(0, 2), munge_batch(UID, 3))

    connections.close_all()

    port = free_port()
    env = dict(os.environ, PORT=str(port), HOST="127.0.0.1", GRIDGATE_LOG_LEVEL="WARNING")
    workers, threads = env.get("GRIDGATE_WEB_WORKERS", "4"), env.get("GRIDGATE_WEB_THREADS", "4")  # gunicorn.conf.py's
    if SERVER == "granian":  # the alternative measured for docs/deployment.md, same processes x threads
        command = [
            *(sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port)),
            *("--workers", workers, "--blocking-threads", threads, "--backlog", "2048", "config.wsgi:application"),
        ]
    else:
        command = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "config.wsgi:application"]
    server = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        set_sync_commit(conninfo, SYNC_COMMIT)  # the server's connections read it when they first open
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        print(
            f"http_load: {SERVER} {workers} processes x {threads} threads, PostgreSQL, "
            f"{SECONDS:g} s per scenario, keep-alive clients (processes)"
        )
        if SYNC_COMMIT == "off":
            print("  synchronous_commit = off: commits do not wait for the disk (NOT durable; a diagnostic)")
        # Warm-up, untimed: every server thread opens its database connection and imports what
        # the first request of each kind imports (Pulser, the emulator driver).
        warm = [
            {"auth": auth, "class_id": klass.pk, "session": sessions[i], "sequence": sequence}
            for i in range(max_clients)
        ]
        with multiprocessing.get_context("fork").Pool(max_clients) as clients_pool:
            for kind in ("floor", "write_floor", "cycles", "submits"):
                run_scenario(clients_pool, kind, "rest", port, warm, WARMUP)
        sent = 0  # distinct sequences made so far: each is sent once in the whole run
        print("  SQL statements per request (work statements; with BEGIN/COMMIT):")
        for label, (work, total, status) in counts.items():
            print(f"    {label:20s} {work} ({total})  [HTTP {status}]")
        window = SECONDS / ROUNDS
        probe_directory, probe_where = wal_directory(conninfo)
        for clients in CLIENTS:
            probe = DiskProbe(probe_directory)
            probe.start()
            # {(proto, kind): [latencies, errors, [(successes, seconds) of each round]]}
            figures = {(proto, kind): [[], 0, []] for proto in PROTOCOLS for kind in KINDS}
            with multiprocessing.get_context("fork").Pool(clients) as clients_pool:
                for _ in range(ROUNDS):
                    for proto in PROTOCOLS:
                        for kind in KINDS:
                            need = int(CRED_RATE * window / clients * (2 if kind == "cycles" else 1)) + 10
                            contexts = []
                            for i in range(clients):
                                ctx = {
                                    "auth": bearer_auth if proto == "jwt" else auth,
                                    "class_id": klass.pk,
                                    "session": sessions[i],
                                    "sequence": sequence,
                                }
                                if proto == "qrmi":
                                    if kind == "cycles":
                                        ctx["creds"] = munge_batch(0, need)
                                    else:
                                        ctx["creds_user"] = munge_batch(UID, need)
                                if kind == "distinct":
                                    ctx["distinct"] = distinct_sequences(sequence, sent, need)
                                    sent += need
                                contexts.append(ctx)
                            latencies, errors, seconds = run_scenario(clients_pool, kind, proto, port, contexts, window)
                            figure = figures[(proto, kind)]
                            figure[0] += latencies
                            figure[1] += errors
                            figure[2].append((len(latencies), seconds))
            disk = probe.stop()
            print(f"  {clients} clients ({ROUNDS} rounds of {window:g} s per scenario, the scenarios taking turns):")
            for proto in PROTOCOLS:
                floor_rounds = figures[(proto, "floor")][2]
                write_floor_rounds = figures[(proto, "write_floor")][2]
                for kind in KINDS:
                    unit = UNITS[kind]
                    lat, errors, rounds = figures[(proto, kind)]
                    ms = [percentile(lat, p) * 1000 for p in (50, 95, 99)]
                    line = (
                        f"    {proto.upper():4s} {kind.replace('_', ' '):11s} {rate_of(rounds):8.1f} {unit:14s} "
                        f"p50 {ms[0]:6.1f} ms  p95 {ms[1]:6.1f} ms  p99 {ms[2]:6.1f} ms  errors {errors:3d}"
                    )
                    if kind == "floor":
                        print(line)
                    elif kind == "write_floor":
                        print(f"{line}  ratio to floor {ratio_to(rounds, floor_rounds)}")
                    else:
                        requests = 2 if kind == "cycles" else 1
                        print(line)
                        print(
                            f"{'':21s}per request{' (a cycle is 2)' if requests == 2 else ''}: "
                            f"to floor {ratio_to(rounds, floor_rounds, requests)}, "
                            f"to write floor {ratio_to(rounds, write_floor_rounds, requests)}"
                        )
            if "jwt" in PROTOCOLS and "rest" in PROTOCOLS:
                print("    JWT bearer to static token, same scenario and rounds (target >= 0.90):")
                for kind in KINDS:
                    ratio = ratio_to(figures[("jwt", kind)][2], figures[("rest", kind)][2])
                    print(f"      {kind.replace('_', ' '):11s} {ratio}")
            print(f"    disk meanwhile ({probe_where}): {disk}")
        print(
            "  targets: acquire+release and submission each >= 0.50 of the write floor per request; "
            ">= 160 cycles/s and >= 350 submissions/s"
        )
    finally:
        issuer.stop()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        set_sync_commit(conninfo, "on")
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {WRITE_FLOOR_TABLE}")
    Job.objects.filter(pool__name=POOL).delete()
    Session.objects.filter(pool__name=POOL).delete()
    ResourcePool.objects.filter(name=POOL).delete()
    Identity.objects.filter(user=user).delete()
    return 0


if __name__ == "__main__":
    Path(ROOT / "var").mkdir(exist_ok=True)
    sys.exit(main())
