"""HTTP throughput of the production server, as a centre runs it (SPEC §9).

Starts what `make run` starts (gunicorn with config/gunicorn.conf.py) on a PostgreSQL bench
database made afresh, then drives keep-alive clients (processes; 8, 32 and 64 by default) for a
fixed time per scenario, over REST with a static token ("rest"), REST with the identity provider's
JWT as a bearer token ("jwt", signed by a loopback issuer) and QRMI (real MUNGE credentials, all
made with `munge` before the timed window; "qrmi"). Each client is its own user.

- floor:       an authenticated request through the same stack that runs one SELECT
               (GET /api/v1/; QRMI: the same with X-Munge-Cred)
- write floor: an authenticated request that inserts one small row and commits durably (POST
               /api/v1/bench/write-floor/, a route that exists only with
               GRIDGATE_BENCH_WRITE_FLOOR=true, which the bench sets for its own server)
- cycles:      acquire + release of a session with a scheduler job id, as Slurm's prolog and
               epilog do (REST POST/DELETE /api/v1/sessions/; QRMI POST sessions + DELETE
               sessions/<id> as the SPANK plugin's root uid, an acquire counted on Warden's 200)
- submits:     job submissions into the client's own session (one Pulser sequence again and
               again: Pulser's QRMI connection sends one per entry of a job's parameters)
- distinct:    the same, with a sequence never sent before on every submission (a sweep)
- mixed:       half the clients cycle and half submit, in one pool at the same time: what a QPU
               pool's day is (Slurm jobs come and go beside users' submissions), with each side's
               rate and latencies
- cycles_history (BENCH_HTTP_HISTORY=1): cycles by a user with BENCH_HTTP_HISTORY_SESSIONS
               (100 000) ended sessions in a pool with BENCH_HTTP_HISTORY_JOBS (1 000 000)
               finished jobs, in the same rounds as ``cycles`` (a user and pool without history):
               the ratio is the cost of history.

Each scenario's time is cut into BENCH_HTTP_ROUNDS rounds (default 5), the scenarios taking turns
in each, so that the machine's drift hits the floors and the figures alike; each figure is printed
with p50/p95/p99, errors, and its ratios per request (a cycle is 2 requests) to the floor and the
write floor of the same rounds, with the spread of the per-round ratios. SQL statements of one
request of each kind are counted in-process through the same code (at psycopg's cursors: none is
hidden).

A/B: ``BENCH_HTTP_BASELINE=<a checkout>`` (a ``git worktree`` of main, say) serves the same site
from that checkout's code on a database of its own, and each round runs every scenario on both
servers in turn: every figure is printed for both, with the ratio of this tree's to the
baseline's. Its site is made by this script's ``_http_site.py`` through the baseline's own code.

Any error in any scenario makes the bench fail (exit status 1) after printing everything.

Every acquire, release and submission ends with a commit that waits for PostgreSQL's WAL to reach
the disk; the write floor waits for that flush and does nothing else, which is why write figures
are judged against it. So the run also prints what the disk did meanwhile (``DiskProbe``).
BENCH_HTTP_SYNC_COMMIT=off measures with the bench databases' ``synchronous_commit = off``
(commits stop waiting for the flush: not durable, never a deployment setting), a diagnostic.
Environment: BENCH_HTTP_SECONDS (default 10: per scenario, all rounds together),
BENCH_HTTP_CLIENTS (default "8,32,64"), BENCH_HTTP_PROTOCOLS ("rest,jwt,qrmi"),
BENCH_HTTP_KINDS ("cycles,submits,distinct,mixed"; both floors are always measured),
GRIDGATE_WEB_WORKERS / GRIDGATE_WEB_THREADS (the server's), BENCH_HTTP_SERVER=granian,
GRIDGATE_BENCH_HTTP_DB (the databases' name prefix, default gridgate_bench_http).
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
from bench._setup import ROOT, percentile  # noqa: E402

SECONDS = float(os.environ.get("BENCH_HTTP_SECONDS", "10"))
CLIENTS = [int(n) for n in os.environ.get("BENCH_HTTP_CLIENTS", "8,32,64").split(",")]
POOL = "bench-http"
SERVER = os.environ.get("BENCH_HTTP_SERVER", "gunicorn")  # what make run uses; "granian" to compare
WARMUP = float(os.environ.get("BENCH_HTTP_WARMUP", "3"))
PROTOCOLS = os.environ.get("BENCH_HTTP_PROTOCOLS", "rest,jwt,qrmi").split(",")
CRED_RATE = 400  # credentials made per client-second of QRMI load: more than the server can use
HISTORY = os.environ.get("BENCH_HTTP_HISTORY", "") not in ("", "0", "false")
HISTORY_SESSIONS = int(os.environ.get("BENCH_HTTP_HISTORY_SESSIONS", "100000"))
HISTORY_JOBS = int(os.environ.get("BENCH_HTTP_HISTORY_JOBS", "1000000"))
MEASURED = os.environ.get("BENCH_HTTP_KINDS", "cycles,submits,distinct,mixed").split(",")
if HISTORY and "cycles_history" not in MEASURED:
    MEASURED.insert(MEASURED.index("cycles") + 1 if "cycles" in MEASURED else 0, "cycles_history")
FLOORS = ("floor", "write_floor")
KINDS = (*FLOORS, *(kind for kind in MEASURED if kind not in FLOORS))
UNITS = {
    "floor": "req/s",
    "write_floor": "req/s",
    "cycles": "cycles/s",
    "cycles_history": "cycles/s",
    "submits": "submissions/s",
    "distinct": "submissions/s",
    "mixed": "requests/s",
}
CYCLES = ("cycles", "cycles_history")
WRITE_FLOOR = "/api/v1/bench/write-floor/"
ROUNDS = int(os.environ.get("BENCH_HTTP_ROUNDS", "5"))
START_MARGIN = 0.5  # seconds for a window's contexts (credentials, sequences) to reach its clients
SYNC_COMMIT = os.environ.get("BENCH_HTTP_SYNC_COMMIT", "on")  # "off": a diagnostic, see the docstring
BASELINE = os.environ.get("BENCH_HTTP_BASELINE", "")
DB_PREFIX = os.environ.get("GRIDGATE_BENCH_HTTP_DB", "gridgate_bench_http")


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


def cycle(client, proto, ctx, munge, job_id) -> bool:
    """One acquire (with a scheduler job id, as Slurm's prolog) and its release."""
    if proto != "qrmi":
        body = {"resource_class": ctx["class_id"], "slots": 1, "external_id": job_id}
        status, answer = client.call("POST", "/api/v1/sessions/", ctx["auth"], body)
        if status != 201:
            return False
        return client.call("DELETE", f"/api/v1/sessions/{json.loads(answer)['id']}/", ctx["auth"])[0] == 204
    body = {"user_id": str(ctx["uid"]), "slurm_job_id": job_id, "qpu_slots": 1}
    status, answer = client.call("POST", f"/qrmi/{ctx['pool']}/sessions", munge(), body)
    if status != 200:  # Warden's next protocol answers 200 for a new session and a repeat alike
        return False
    return client.call("DELETE", f"/qrmi/{ctx['pool']}/sessions/{json.loads(answer)['id']}", munge())[0] == 200


def submit(client, proto, ctx, munge, sequence) -> bool:
    if proto != "qrmi":
        body = {"payload": {"sequence": sequence}, "shots": 10}
        return client.call("POST", f"/api/v1/sessions/{ctx['session']}/jobs/", ctx["auth"], body)[0] == 201
    headers = {**munge(), "X-Warden-Session": ctx["session"]}
    return client.call("POST", f"/qrmi/{ctx['pool']}/jobs", headers, {"sequence": sequence, "shots": 10})[0] == 200


def scenario_worker(args):
    """One client: from ``start`` on, run its scenario until the deadline; return (latencies of
    successes by what they were, errors, end)."""
    kind, proto, port, start, deadline, ctx = args
    time.sleep(max(0.0, start - time.monotonic()))
    client = Client(port)
    creds = iter(ctx.get("creds", []))
    distinct = iter(ctx.get("distinct", []))
    latencies, errors, done = {"cycle": [], "submit": [], "request": []}, 0, 0

    def munge():
        return {"X-Munge-Cred": next(creds)}

    role = ctx.get("role", "cycle" if kind in CYCLES else "submit")
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        try:
            if kind == "floor":
                what = "request"
                ok = client.call("GET", "/api/v1/", ctx["auth"] if proto != "qrmi" else munge())[0] == 200
            elif kind == "write_floor":
                what = "request"
                ok = client.call("POST", WRITE_FLOOR, ctx["auth"] if proto != "qrmi" else munge())[0] == 204
            elif role == "cycle":
                what, done = "cycle", done + 1
                ok = cycle(client, proto, ctx, munge, f"{ctx['job_prefix']}{done}")
            else:
                what = "submit"
                ok = submit(client, proto, ctx, munge, next(distinct) if kind == "distinct" else ctx["sequence"])
        except StopIteration:
            break  # out of pre-made credentials: the window ends early for this client
        if ok:
            latencies[what].append(time.perf_counter() - t0)
        else:
            errors += 1
    return latencies, errors, time.monotonic()


def run_scenario(pool, kind, proto, port, contexts, seconds):
    """One timed window of ``kind`` with one client process per context (``pool``'s, forked
    before): every client starts at the same moment, after the contexts reached them.
    Returns ({what: latencies of successes}, errors, seconds)."""
    start = time.monotonic() + START_MARGIN
    deadline = start + seconds
    results = pool.map(scenario_worker, [(kind, proto, port, start, deadline, ctx) for ctx in contexts], chunksize=1)
    latencies = {
        what: [value for lat, _, _ in results for value in lat[what]] for what in ("cycle", "submit", "request")
    }
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
    """Requests per second of ``rounds`` (``requests`` per success: a cycle is 2) over the other
    figure's of the same rounds, and the spread of the per-round ratios."""
    whole = requests * rate_of(rounds) / (rate_of(floor_rounds) or float("nan"))
    by_round = sorted(
        requests * rate_of([r]) / (rate_of([f]) or float("nan")) for r, f in zip(rounds, floor_rounds, strict=True)
    )
    return f"{whole:.2f} (rounds {by_round[0]:.2f}-{by_round[-1]:.2f})"


def fresh_database(server: str, name: str) -> str:
    import psycopg

    with psycopg.connect(server + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def prepare_site(tree: Path, url: str, issuer: str) -> dict:
    """The site in the database at ``url``, made by ``tree``'s own code (bench/_http_site.py)."""
    options = {"pool": POOL, "clients": max(CLIENTS), "issuer": issuer}
    if HISTORY:
        options.update(history_sessions=HISTORY_SESSIONS, history_jobs=HISTORY_JOBS)
    env = dict(os.environ, DATABASE_URL=url, GRIDGATE_LOG_LEVEL="WARNING", DEBUG="false")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "_http_site.py")],
        cwd=tree,
        env=env,
        input=json.dumps(options),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"preparing the site of {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def statements_per_request(site, sequence, root_creds, user_creds):
    """SQL statements of one request of each kind, counted in-process through this tree's code at
    psycopg's cursors (so that nothing is hidden from the count). {kind: (statements, HTTP status)}."""
    from unittest import mock

    import psycopg
    from django.test import Client as DjangoClient

    me = site["clients"][0]
    client = DjangoClient(HTTP_AUTHORIZATION=f"Token {me['token']}")
    client.get("/api/v1/")  # the token's first use in a minute records it: counted apart from requests
    counts = {}
    execute = psycopg.Cursor.execute

    def count(label, call):
        sent = []

        def counted(cursor, query, *args, **kwargs):
            sent.append(query)
            return execute(cursor, query, *args, **kwargs)

        with mock.patch.object(psycopg.Cursor, "execute", counted):
            response = call()
        counts[label] = (len(sent), response.status_code)
        return response

    count("floor (REST)", lambda: client.get("/api/v1/"))
    count("write floor (REST)", lambda: client.post(WRITE_FLOOR))
    body = {"resource_class": site["class_id"], "external_id": "statements.1"}
    created = count("acquire (REST)", lambda: client.post("/api/v1/sessions/", body, content_type="application/json"))
    sid = created.json()["id"]
    count("release (REST)", lambda: client.delete(f"/api/v1/sessions/{sid}/"))

    def rest_submit():
        return client.post(
            f"/api/v1/sessions/{me['session']}/jobs/",
            {"payload": {"sequence": sequence}, "shots": 10},
            content_type="application/json",
        )

    # The first submission into an idle pool also wakes the dispatcher (once: R-SCHED-5's
    # coalesced wake-up) and reads the session; the ones after it are the common path.
    count("submit (REST, first)", rest_submit)
    count("submit (REST)", rest_submit)
    q = DjangoClient()
    creds, user = iter(root_creds), iter(user_creds)
    count("floor (QRMI stack)", lambda: q.get("/api/v1/", HTTP_X_MUNGE_CRED=next(user)))
    count("write floor (QRMI)", lambda: q.post(WRITE_FLOOR, HTTP_X_MUNGE_CRED=next(user)))
    acquire = {"user_id": str(me["uid"]), "slurm_job_id": "statements.2"}
    created = count(
        "acquire (QRMI)",
        lambda: q.post(
            f"/qrmi/{POOL}/sessions", acquire, content_type="application/json", HTTP_X_MUNGE_CRED=next(creds)
        ),
    )
    qsid = created.json()["id"]
    count("release (QRMI)", lambda: q.delete(f"/qrmi/{POOL}/sessions/{qsid}", HTTP_X_MUNGE_CRED=next(creds)))

    def qrmi_submit():
        return q.post(
            f"/qrmi/{POOL}/jobs",
            {"sequence": sequence, "shots": 10},
            content_type="application/json",
            HTTP_X_MUNGE_CRED=next(user),
            HTTP_X_WARDEN_SESSION=me["session"],
        )

    count("submit (QRMI, first)", qrmi_submit)
    count("submit (QRMI)", qrmi_submit)
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


class Side:
    """One measured server: a checkout, its database and site, its process and port."""

    def __init__(self, label: str, tree: Path, url: str, site: dict):
        self.label, self.tree, self.url, self.site = label, tree, url, site
        self.port, self.process = free_port(), None

    def start(self, env: dict) -> None:
        workers, threads = env.get("GRIDGATE_WEB_WORKERS", "4"), env.get("GRIDGATE_WEB_THREADS", "4")
        if SERVER == "granian":  # the alternative measured for docs/deployment.md, same processes x threads
            command = [
                *(sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1"),
                *("--port", str(self.port), "--workers", workers, "--blocking-threads", threads),
                *("--backlog", "2048", "config.wsgi:application"),
            ]
        else:
            command = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "config.wsgi:application"]
        env = dict(env, DATABASE_URL=self.url, PORT=str(self.port), HOST="127.0.0.1")
        # The server's own log (a baseline's refusals logged one per line) apart from the figures.
        self.log = ROOT / "var" / f"bench-http-{self.label}.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                command, cwd=self.tree, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the {self.label} server did not start")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)

    def contexts(self, kind: str, proto: str, clients: int, bearer: dict, sequence: str, sent: list) -> list[dict]:
        """What each client of a window needs (credentials and sequences made now, untimed)."""
        window = SECONDS / ROUNDS
        site, contexts = self.site, []
        for i in range(clients):
            me = site["clients"][i]
            role = ("cycle" if i % 2 == 0 else "submit") if kind == "mixed" else None
            if kind == "cycles" or (role == "cycle"):
                who, pool, class_id = (site["cycler"] if kind == "cycles" else me), site["pool"], site["class_id"]
            elif kind == "cycles_history":
                who, pool, class_id = site["history_user"], site["history_pool"], site["history_class_id"]
            else:
                who, pool, class_id = me, site["pool"], site["class_id"]
            ctx = {
                "auth": bearer[who["username"]] if proto == "jwt" else {"Authorization": f"Token {who['token']}"},
                "uid": who["uid"],
                "pool": pool,
                "class_id": class_id,
                "session": me["session"],
                "sequence": sequence,
                "job_prefix": f"{self.label}-{kind}-{proto}-{clients}-{i}-{time.monotonic_ns()}.",
            }
            if role:
                ctx["role"] = role
            cycling = kind in CYCLES or role == "cycle"
            if proto == "qrmi":
                need = int(CRED_RATE * window / clients * (2 if cycling else 1)) + 10
                ctx["creds"] = munge_batch(0 if cycling else who["uid"], need)
            if kind == "distinct":
                need = int(CRED_RATE * window / clients) + 10
                ctx["distinct"] = distinct_sequences(sequence, sent[0], need)
                sent[0] += need
            contexts.append(ctx)
        return contexts


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
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        print("http_load: skipped (needs PostgreSQL: set DATABASE_URL or start it on 127.0.0.1:5432)")
        return 0
    subprocess.run([str(ROOT / "scripts/munge-local.sh"), "start"], capture_output=True)
    server_url = url.rsplit("/", 1)[0]
    os.environ.update(DEBUG="false", ALLOWED_HOSTS="127.0.0.1,testserver", GRIDGATE_BENCH_WRITE_FLOOR="true")
    from tests.doubles.jwks_server import Issuer

    issuer = Issuer().start()
    trees = [("new", ROOT)] + ([("base", Path(BASELINE).resolve())] if BASELINE else [])
    sides = []
    for label, tree in trees:
        database = fresh_database(server_url, f"{DB_PREFIX}_{label}")
        print(f"http_load: preparing the {label} site ({tree}){' with history' if HISTORY else ''}", flush=True)
        sides.append(Side(label, tree, database, prepare_site(tree, database, issuer.url)))
    # This tree's own code, for the statement counts, on its own database.
    os.environ["DATABASE_URL"] = sides[0].url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("GRIDGATE_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    sequence = sequence_repr()
    me = sides[0].site["clients"][0]
    counts = statements_per_request(sides[0].site, sequence, munge_batch(0, 2), munge_batch(me["uid"], 4))
    from django.db import connections

    connections.close_all()
    env = dict(
        os.environ,
        GRIDGATE_LOG_LEVEL="WARNING",
        GRIDGATE_OIDC_ISSUER=issuer.url,
        GRIDGATE_OIDC_JWKS_ENDPOINT=f"{issuer.url}/jwks",
        GRIDGATE_OIDC_CLIENT_ID="gridgate",
        GRIDGATE_OIDC_AUDIENCE="gridgate-api",  # the test issuer's audience, whatever a checkout's default
    )
    usernames = {c["username"] for side in sides for c in side.site["clients"]} | {"bench-http-cycler"}
    if HISTORY:
        usernames.add("bench-http-history")
    bearer = {name: {"Authorization": f"Bearer {issuer.token(sub=name, lifetime=6 * 3600)}"} for name in usernames}
    failed = 0
    try:
        for side in sides:
            set_sync_commit(side.url, SYNC_COMMIT)  # the server's connections read it when they first open
            side.start(env)
        workers, threads = env.get("GRIDGATE_WEB_WORKERS", "4"), env.get("GRIDGATE_WEB_THREADS", "4")
        print(
            f"http_load: {SERVER} {workers} processes x {threads} threads, PostgreSQL, {SECONDS:g} s per scenario "
            f"and server, keep-alive clients (processes), each its own user"
            + (f"; A/B: this tree (new) against {BASELINE} (base), interleaved" if BASELINE else "")
        )
        if SYNC_COMMIT == "off":
            print("  synchronous_commit = off: commits do not wait for the disk (NOT durable; a diagnostic)")
        print("  SQL statements per request (counted at psycopg's cursors: none hidden):")
        for label, (statements, status) in counts.items():
            print(f"    {label:22s} {statements}  [HTTP {status}]")
        sent = [0]  # distinct sequences made so far: each is sent once in the whole run
        with multiprocessing.get_context("fork").Pool(max(CLIENTS)) as clients_pool:
            for side in sides:  # untimed: every server thread opens its connection and imports Pulser
                for kind in ("floor", "cycles", "submits"):
                    contexts = side.contexts(kind, "rest", max(CLIENTS), bearer, sequence, sent)
                    run_scenario(clients_pool, kind, "rest", side.port, contexts, WARMUP)
        probe_directory, probe_where = wal_directory(sides[0].url)
        for clients in CLIENTS:
            failed += measure(clients, sides, bearer, sequence, sent, probe_directory, probe_where)
        print(
            "  targets: acquire+release and submission each >= 0.50 of the write floor per request; mixed: 0 errors, "
            "p99 <= 1 s at 64 clients; cycles_history within 10 % of cycles"
        )
    finally:
        issuer.stop()
        for side in sides:
            side.stop()
            set_sync_commit(side.url, "on")
    if failed:
        print(
            f"http_load: FAILED: {failed} request(s) to this tree's server answered with an error "
            "(every scenario must have none)"
        )
        return 1
    return 0


def measure(clients, sides, bearer, sequence, sent, probe_directory, probe_where) -> int:
    """Every scenario at ``clients`` clients on every side, rounds interleaved; prints the figures
    and returns the errors counted."""
    window = SECONDS / ROUNDS
    probe = DiskProbe(probe_directory)
    probe.start()
    # {(side, proto, kind): [{what: latencies}, errors, [(successes, seconds) of each round]]}
    figures = {
        (side.label, proto, kind): [{"cycle": [], "submit": [], "request": []}, 0, []]
        for side in sides
        for proto in PROTOCOLS
        for kind in KINDS
    }
    with multiprocessing.get_context("fork").Pool(clients) as clients_pool:
        for _ in range(ROUNDS):
            for proto in PROTOCOLS:
                for kind in KINDS:
                    for side in sides:
                        contexts = side.contexts(kind, proto, clients, bearer, sequence, sent)
                        latencies, errors, seconds = run_scenario(
                            clients_pool, kind, proto, side.port, contexts, window
                        )
                        figure = figures[(side.label, proto, kind)]
                        for what, values in latencies.items():
                            figure[0][what] += values
                        figure[1] += errors
                        figure[2].append((sum(len(values) for values in latencies.values()), seconds))
    disk = probe.stop()
    errors_seen = 0  # this tree's only: a baseline's errors are a figure, not this run's failure
    print(f"  {clients} clients ({ROUNDS} rounds of {window:g} s per scenario and server, the scenarios taking turns):")
    for proto in PROTOCOLS:
        for kind in KINDS:
            for side in sides:
                lat, errors, rounds = figures[(side.label, proto, kind)]
                errors_seen += errors if side is sides[0] else 0
                floor_rounds = figures[(side.label, proto, "floor")][2]
                write_rounds = figures[(side.label, proto, "write_floor")][2]
                tag = f"{proto.upper():4s} {kind.replace('_', ' '):14s}" + (
                    f" {side.label:4s}" if len(sides) > 1 else ""
                )
                every = [value for values in lat.values() for value in values]
                ms = [percentile(every, p) * 1000 for p in (50, 95, 99)]
                print(
                    f"    {tag} {rate_of(rounds):8.1f} {UNITS[kind]:14s} p50 {ms[0]:6.1f} ms  p95 {ms[1]:6.1f} ms  "
                    f"p99 {ms[2]:6.1f} ms  errors {errors:3d}"
                )
                if kind == "write_floor":
                    print(f"{'':10s}ratio to floor {ratio_to(rounds, floor_rounds)}")
                elif kind == "mixed":
                    for what in ("cycle", "submit"):
                        values = lat[what]
                        seconds = sum(elapsed for _, elapsed in rounds)
                        rate = len(values) / seconds if seconds else 0
                        ms = [percentile(values, p) * 1000 for p in (50, 95, 99)]
                        print(
                            f"{'':10s}{what + 's':8s} {rate:8.1f}/s  p50 {ms[0]:6.1f} ms  p95 {ms[1]:6.1f} ms  "
                            f"p99 {ms[2]:6.1f} ms"
                        )
                elif kind != "floor":
                    requests = 2 if kind in CYCLES else 1
                    print(
                        f"{'':10s}per request{' (a cycle is 2)' if requests == 2 else ''}: to floor "
                        f"{ratio_to(rounds, floor_rounds, requests)}, to write floor "
                        f"{ratio_to(rounds, write_rounds, requests)}"
                    )
                if kind == "cycles_history":
                    clean = figures[(side.label, proto, "cycles")][2] if "cycles" in KINDS else None
                    if clean:
                        print(f"{'':10s}with history / without: {ratio_to(rounds, clean)}")
            if len(sides) > 1:
                ours, theirs = (figures[(side.label, proto, kind)][2] for side in sides)
                print(f"{'':10s}new / base: {ratio_to(ours, theirs)}")
    if "jwt" in PROTOCOLS and "rest" in PROTOCOLS:
        print("    JWT bearer to static token, same scenario and rounds (target >= 0.90):")
        for kind in KINDS:
            ratio = ratio_to(figures[(sides[0].label, "jwt", kind)][2], figures[(sides[0].label, "rest", kind)][2])
            print(f"      {kind.replace('_', ' '):14s} {ratio}")
    print(f"    disk meanwhile ({probe_where}): {disk}")
    return errors_seen


if __name__ == "__main__":
    Path(ROOT / "var").mkdir(exist_ok=True)
    sys.exit(main())
