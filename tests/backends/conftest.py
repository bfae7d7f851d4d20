"""Backends run for real here: local pools use the local backend, Slurm pools the Slurm one,
FirecREST, Qarnot and Run:AI pools theirs against the HTTP doubles of ``tests/doubles`` (on 127.0.0.1)."""

import json
import os
import pwd
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection as db
from django.test import Client

from apps.backends.base import SubmitSpec
from apps.backends.firecrest import backend as fc_backend
from apps.backends.firecrest import client as fc_client
from apps.backends.firecrest.backend import FirecrestBackend
from apps.backends.qarnot import client as qb_client
from apps.backends.qarnot.backend import QarnotBackend, bucket_names
from apps.backends.remote import clear_clients
from apps.backends.remote_common import secret_forms
from apps.backends.runai import client as rb_client
from apps.backends.runai.backend import RunaiBackend
from apps.cases import passes, workspace
from apps.cases.models import Case
from apps.credentials import services as credential_services
from apps.qrmi.models import UnixAccount
from apps.resources.models import ResourceClass, ResourcePool
from tests.cases.conftest import cases_root, launched, make_case  # noqa: F401 - shared fixtures
from tests.doubles.firecrest_server import FirecrestDouble
from tests.doubles.qarnot_server import QarnotDouble
from tests.doubles.runai_server import RunaiDouble


@pytest.fixture(autouse=True)
def real_backends(settings, cases_root):  # noqa: F811
    settings.GRIDGATE_CASE_BACKENDS = None  # every pool kind to its own backend
    settings.GRIDGATE_ALLOW_INSECURE_REMOTES = True  # the doubles speak plain http on 127.0.0.1
    # The test accounts are system accounts (useradd --system): below the production floor of 1000.
    settings.GRIDGATE_CASE_MIN_UID = 100


def wait_for_terminal(case, *, timeout: float = 60.0, poll_every: float = 0.2):
    """Run poll passes until the case ends (a bounded wait for a real process, not a timing test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        passes.poll_pass(case_ids=[case.id])
        case.refresh_from_db()
        if case.is_terminal:
            return case
        time.sleep(poll_every)
    raise AssertionError(f"case {case.id} still {case.status} after {timeout} s: {case.last_error}")


def wait_until(predicate, *, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


def slurm_unavailable_reason() -> str | None:
    if not shutil.which("sbatch"):
        return "sbatch is not installed (run scripts/slurm-local.sh start)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol ping failed: {exc}"
    if "UP" not in ping.stdout:
        return f"slurmctld is not up ({(ping.stdout + ping.stderr).strip()}); run scripts/slurm-local.sh start"
    return None


def _required_or_skip(reason: str, what: str = "sandbox", variable: str = "GRIDGATE_SANDBOX_TESTS"):
    """Skip the ``what`` tests with the reason outside CI; under CI=true (or ``variable``=1) fail them."""
    if os.environ.get("CI", "").lower() == "true" or os.environ.get(variable) == "1":
        pytest.fail(f"{what} tests are required here (CI/{variable}) but {reason}")
    pytest.skip(f"{what} not available: {reason}")


@pytest.fixture(scope="session")
def slurm_cluster():
    """Skip Slurm tests with the reason outside CI; under CI=true a missing cluster fails them."""
    reason = slurm_unavailable_reason()
    if reason:
        _required_or_skip(reason, "Slurm", "GRIDGATE_SLURM_TESTS")
    return True


#: Unix accounts the isolation tests run cases as (R-CASE-8); .ci/run creates them too.
TEST_ACCOUNTS = ("gridgate-test1", "gridgate-test2", "gridgate-sandbox")


@pytest.fixture(scope="session")
def sandbox_host():
    """Root, bubblewrap and the test accounts: cases really run as their owners' accounts.
    Skipped with the reason outside CI; under CI=true a missing piece fails the tests."""
    if shutil.which("bwrap") is None:
        _required_or_skip("bubblewrap is not installed (apt install bubblewrap)")
    if os.geteuid() != 0:
        _required_or_skip("running cases as other accounts needs root")
    for name in TEST_ACCOUNTS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
            )
    return {name: pwd.getpwnam(name) for name in TEST_ACCOUNTS}


@pytest.fixture
def link_account(sandbox_host):
    """``link_account(user, "gridgate-test1")``: the user's Unix account link (the QRMI one)."""

    def link(user, name="gridgate-test1"):
        entry = sandbox_host[name]
        UnixAccount.objects.update_or_create(user=user, defaults={"unix_uid": entry.pw_uid})
        return entry

    return link


#: the service's secrets, set in the worker's environment: no case's command may read them (R-CASE-8)
SECRETS = {
    "SECRET_KEY": "django-secret-4711",
    "DATABASE_URL": "postgres://gridgate:db-password-4711@db/gridgate",
    "QARNOT_TOKEN": "qarnot-token-4711",
    "FIRECREST_CLIENT_SECRET": "firecrest-secret-4711",
}


def read_as(account, path: Path) -> subprocess.CompletedProcess:
    """``cat path`` as another Unix account (no groups but its own)."""
    return subprocess.run(
        ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", "cat", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def api_create(client, rc, command, inputs=()) -> str:
    """A case of class ``rc`` created through the API, ``inputs`` ((name, bytes) pairs) uploaded with it: its id."""
    body = {"name": "c", "resource_class": rc.pk, "command": command}
    if inputs:
        body["inputs"] = [SimpleUploadedFile(name, data) for name, data in inputs]
    response = client.post("/api/v1/cases/", body, format="multipart" if inputs else "json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def api_launch(client, case_id):
    """The launch request (202: recorded) and the worker's submit step for it (R-CASE-1)."""
    response = client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json")
    if response.status_code == 202:
        passes.submit_pass(case_ids=[case_id])
    return response


def api_launched(client, rc, command, inputs=()) -> str:
    """A case created and launched through the API (its launch answered 202): its id."""
    case_id = api_create(client, rc, command, inputs)
    response = api_launch(client, case_id)
    assert response.status_code == 202, response.content
    return case_id


# -- users of the per-user credential tests ------------------------------------------------------
@pytest.fixture
def ada(db):
    return get_user_model().objects.create_user("ada", password="pw")


@pytest.fixture
def bob(db):
    return get_user_model().objects.create_user("bob", password="pw")


def browser(user, **options) -> Client:
    """A browser logged in as ``user`` (the connections pages); ``options`` go to the test client."""
    client = Client(**options)
    client.force_login(user)
    return client


def submit_spec(case_id, workspace, **fields) -> SubmitSpec:
    """A submission of ``true`` with nothing else in it than ``fields`` say."""
    empty = dict.fromkeys(("pool_remote", "resources", "environment", "launch_options"), {})
    empty |= dict.fromkeys(("batch_directives", "observability_globs"), [])
    return SubmitSpec(case_id=case_id, workspace=workspace, **{"command": "true", **empty, **fields})


def write_inputs(case, inputs=None):
    """The case's inputs (``in.txt`` unless ``inputs`` names others), each text or bytes."""
    for name, data in (inputs or {"in.txt": "input\n"}).items():
        path = workspace.case_dir(case.id) / "inputs" / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    return case


def launch(make, pool, command, *, inputs=None, resource_class=None, **kwargs):
    """A case on ``pool`` (its one class unless ``resource_class``) with its inputs written, launched
    (the worker's submit step run); ``make`` is the ``make_case`` fixture, ``kwargs`` go to it."""
    case = make(resource_class=resource_class or pool.classes.get(), command=command, **kwargs)
    return launched(write_inputs(case, inputs))


def poll_once(case):
    """One poll pass for the case, due now."""
    Case.objects.filter(pk=case.pk).update(next_poll_at=None)
    passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    return case


def poll_until(case, predicate, *, timeout: float = 90.0):
    wait_until(lambda: predicate(poll_once(case)), timeout=timeout, what="case state")
    return case


def raw_sealed(connection_id) -> str:
    """The sealed credential as the database column holds it."""
    with db.cursor() as cursor:
        cursor.execute("SELECT sealed_secret FROM backends_remoteconnection WHERE id = %s", [connection_id])
        return cursor.fetchone()[0]


class Listener:
    """A host a pool is moved to, or named by a row the rules refuse: records every request it gets
    (its line, headers and body), and answers each with an empty JSON object. A context manager:
    the host stops at the end of the ``with``."""

    def __init__(self):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append(f"{self.requestline}\n{self.headers}\n{body.decode(errors='replace')}")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"storage": null}')

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reached(self, secrets) -> list[str]:
        """The forms of ``secrets`` that reached this host."""
        text = "\n".join(self.seen)
        return [form for form in secret_forms(secrets) if form in text]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


# -- one provider's per-user side, for the contract tests and the provider's own ----------------------
#: the sealing key of the per-user credential tests
SEALING_KEY = Fernet.generate_key().decode()


class Driver:
    """One provider's per-user credentials as the tests drive them: its loopback double, which
    knows ada and bob and checks that every call about a case comes from the case owner's
    credential (``expect_owner``; the ``driver`` fixture fails the test on any that did not), a
    per-user pool, the user's connect step, and what the double saw."""

    name = kind = label_word = option = ""
    choices: tuple = ((), ())  # the option's choices before connecting, and with ada's credential
    refused_words: tuple = ()  # what the page says when the provider refuses what the user gave
    lost_words = "was refused by the provider (401: revoked or expired)"  # a launch's words after
    disconnected: dict = {}  # the API's answer to DELETE /connections/{pool}/
    poll_listing: str | None = None  # the one listing a poll pass makes per user's credential (R-BACK-4)
    options_call: tuple = ()  # the double's (method, path) the option's choices are read from
    losses: tuple = ("revoked",)  # ways the provider stops taking a credential
    renews = True  # it issues access tokens from the credential, and a 401 gets a fresh one
    get_status = True  # its SDK's errors of a GET carry the HTTP status
    remote_id = "w-1"  # the shape of the provider's id of a job
    echoes = False  # the provider's refusals echo the credential
    secrets_known = 2  # at least this many of the user's secrets by the time a case ran
    service_label = service_owner = ""
    resources: dict = {}  # the pools' one class
    backend = module = None  # the provider's backend and its client.py
    secret = secret_env = ""  # the service credential's secret and its variable
    listing_path = ""  # the double's path of ``listing``
    # -- service-account pools (the contract's section of that name)
    secret_key = ""  # the remote key a pool would hold the secret under: R-POOL-7 names ``<key>_env``
    refused_service_words = ""  # a launch's words when the provider refuses the service credential
    submit_call: tuple = ()  # the double's (method, path) of a submission
    lookup_call: tuple = ()  # what finds a job by its name after an uncertain submission (R-CASE-1)
    refusing_statuses: tuple = ()  # a submission's 5xx that says it was not carried out: the case waits
    state_dir, state_files = "", frozenset()  # the backend's directory in the case workspace, its files
    doctor_checks: tuple = ()  # what ``manage.py doctor --pool`` checks on a service pool
    # -- a case's life (the contract's last section)
    inputs: dict = {}  # inputs besides in.txt, each a provider fact (FirecREST's big one)
    exit_words = ""  # the provider's words for a command that exited with code 3
    degraded: tuple = ()  # the option's default and choices while the provider is unreachable
    # -- where credentials go, and who may read them
    url_keys: tuple = ()  # the remote's keys naming the hosts a credential is sent to
    refreshes = False  # the user's credential is a refresh token, traded at token_uri for access tokens
    service_env: dict = {}  # a service pool's ``*_env`` keys and the credential variables they name

    def session(self, pool, identity=None):
        return self.module.Session(pool.remote_config(), identity=identity)

    def token_requests(self) -> int:
        return sum(1 for _method, path in list(self.double.calls) if "token" in path)

    def __init__(self, double, remote: dict):
        self.double = double
        pool = ResourcePool(name=f"{self.name}-users", kind=self.kind, public=True, remote=remote)
        pool.full_clean()  # valid as written: no "credentials" key means each user's own
        pool.save()
        ResourceClass.objects.create(pool=pool, name="node", default=True, **self.resources)
        self.pool = pool

    def service_pool(self, name="", klass=None, **remote) -> ResourcePool:
        """A pool of the service account's: the per-user pool's remote and ``remote``; its one
        class ``node`` with the driver's resources, or as ``klass`` says."""
        pool = ResourcePool.objects.create(
            name=name or f"{self.name}-service",
            kind=self.kind,
            public=True,
            remote={**self.pool.remote, "credentials": "service", **remote},
        )
        ResourceClass.objects.create(pool=pool, default=True, **{"name": "node", **self.resources, **(klass or {})})
        return pool

    def case(self, make, user, command, *, pool=None):
        """A case of ``user`` whose every provider call the double checks is made as their account
        (``expect_owner``), with its inputs written."""
        case = make(user=user, resource_class=(pool or self.pool).classes.get(), command=command)
        self.double.expect_owner(case.id, self.account(user))
        return write_inputs(case)

    def label(self, user) -> str:
        return f"user {user.username} ({self.label_word} {self.subject(user)})"

    def sealed_opens_to(self, user) -> str:
        return self.secrets(user)[0]

    # what differs, filled in below
    def listing(self, session): ...  # one cheap listing
    def connect(self, user) -> list: ...  # the responses the user saw; the last one followed
    def offer(self, user): ...  # the first step of connecting, followed
    def refuse(self, user): ...  # what the user gives is refused by the provider
    def reconnect(self, user) -> list: ...  # a new working credential
    def lose(self, user, how: str) -> None: ...  # the provider no longer takes the credential
    def account(self, user) -> str: ...  # whom ``expect_owner`` names
    def subject(self, user) -> str: ...  # the connection's subject, and the owner the double records
    def saved(self, user) -> str: ...  # the page's words once connected
    def owner_of(self, case) -> str: ...
    def jobs(self) -> int: ...
    def secrets(self, user) -> list[str]: ...  # the credential as stored first, then what it gave
    def alive(self, user) -> bool: ...  # the provider still takes the user's credential
    def held(self, command) -> str: ...  # ``command``, run once released
    def running(self, case) -> None: ...  # wait until the provider runs it
    def release(self, case) -> None: ...
    def ended(self, case) -> None: ...  # wait until the provider has the job ended, its output unread
    def cancelled(self, case) -> None: ...  # assert (waiting if need be) the provider cancelled the job
    def named(self, case) -> str: ...  # the provider's id of the job named after the case
    def remote_side(self, case) -> tuple[bool, ...]: ...  # what of the case the provider still holds
    def access_tokens(self) -> list[str]: ...  # the tokens the provider issued (none: Qarnot's is the secret)
    def quote_refusals(self, sent: str) -> None: ...  # its refusals quote the credential (a gateway in debug mode)
    def submitted(self, case) -> None: ...  # assert the provider's own facts of a submitted job
    def workdir(self, case) -> Path: ...  # where the job runs, as the test can reach it
    def poll_path(self, case) -> str: ...  # the double's path (a regex) of the case's status call


class FirecrestDriver(Driver):
    """FirecREST: the double is also the identity provider; a user connects through its OAuth
    flow (authorization code + PKCE), the browser played by the Django test client and httpx."""

    name = kind = "firecrest"
    label_word, option = "subject", "partition"
    choices = (["debug"], ["debug", "normal", "gpu"])  # not connected: the pool's own partition
    refused_words = ("Connecting was refused", "Code not valid")
    lost_words = "has expired or was revoked"
    remote_id = "1@cluster"
    disconnected = {
        "revoked": True,
        "detail": "Gridgate no longer holds the grant, and the identity provider has revoked it.",
    }
    service_label = "service account (GRIDGATE_CRED_FC_ID)"
    service_owner = "service-account-gridgate-client"
    resources = {"cpu": 1, "memory": 1}
    secrets_known = 4  # refresh tokens (rotated), access tokens, the PKCE verifier
    url_keys, refreshes = ("api_url", "token_uri"), True  # access tokens to api_url, refresh tokens to token_uri
    service_env = {"client_id_env": "GRIDGATE_CRED_FC_ID", "client_secret_env": "GRIDGATE_CRED_FC_SECRET"}
    backend, module, listing_path = FirecrestBackend(), fc_client, "/status/systems"
    secret, secret_env = "s3cr3t-client-VALUE-42", "GRIDGATE_CRED_FC_SECRET"  # noqa: S105
    secret_key, refused_service_words = "client_secret", "client credentials"
    refusing_statuses = (500,)  # to FirecREST a 500 is no "maybe carried out"
    state_dir, state_files = ".firecrest", frozenset({"manifest.json"})
    doctor_checks = ("sdk", "credentials", "auth", "reachability", "system", "partition", "working_root")

    def __init__(self, tmp_path):
        double = FirecrestDouble(tmp_path / "hpc", client_secret=self.secret).start()
        double.add_user("ada")
        double.add_user("bob")
        double.partitions = ["debug", "normal", "gpu"]
        self.poll_listing = f"/compute/{double.system}/jobs"
        self.options_call = ("GET", f"/status/{double.system}/partitions")
        self.submit_call, self.lookup_call = ("POST", self.poll_listing), ("GET", self.poll_listing)
        super().__init__(double, self.remote(double))

    @staticmethod
    def remote(double, **extra) -> dict:
        return {
            "api_url": double.url,
            "token_uri": double.token_uri,
            "authorization_uri": double.authorization_uri,
            "system_name": double.system,
            "partition": "debug",
            "working_root": str(double.fs_root / "scratch"),
            "client_id_env": "GRIDGATE_CRED_FC_ID",
            "client_secret_env": "GRIDGATE_CRED_FC_SECRET",
            **extra,
        }

    def listing(self, session):
        return session.call("system listing", "systems")

    def start(self, client, user, login_as=None):
        self.double.login_as = login_as or user.username
        start = client.post(f"/connections/{self.pool.pk}/connect/")
        assert start.status_code == 302, start.content
        return start

    def connect(self, user, *, login_as=None):
        """Gridgate → the provider's authorize endpoint (signed in there as ``login_as``) → back."""
        client = browser(user)
        start = self.start(client, user, login_as)
        provider = httpx.get(start["Location"], follow_redirects=False)
        assert provider.status_code == 302, provider.text
        back = urlsplit(provider.headers["location"])
        assert back.path == "/connections/callback/"
        done = client.get(f"{back.path}?{back.query}", follow=True)
        assert done.redirect_chain[0][1] == 302
        return [start, done]

    reconnect = connect  # a new grant

    def offer(self, user):
        return browser(user).post(f"/connections/{self.pool.pk}/connect/", follow=True)

    def refuse(self, user):
        client = browser(user)
        state = parse_qs(urlsplit(self.start(client, user)["Location"]).query)["state"][0]
        return client.get(f"/connections/callback/?code=made-up&state={state}", follow=True)

    def lose(self, user, how):
        self.double.revoke_user(user.username)  # e.g. an administrator ended the user's sessions

    def account(self, user):
        return user.username

    def subject(self, user):
        return self.double.subject_of(user.username)

    def saved(self, user):
        return f"Connected to {self.pool.name} as {user.username}"

    def owner_of(self, case):
        return next(job.owner for job in self.double.user_jobs() if job.name == str(case.id))

    def jobs(self):
        return len(self.double.user_jobs())

    def sealed_opens_to(self, user):
        (live,) = self.double.live_refresh_tokens(user.username)
        return live

    def secrets(self, user):
        subject = self.subject(user)
        refresh = [t for t, r in self.double.refresh_tokens.items() if r["sub"] == subject]
        access = [token for token, owner in self.double.token_subjects.items() if owner == subject]
        return refresh + access + self.double.verifiers

    def alive(self, user):
        return bool(self.double.live_refresh_tokens(user.username))

    def held(self, command):
        return f"echo started; while [ ! -e go ]; do sleep 0.1; done; {command}"

    def running(self, case):
        out = self.double.fs_root / "scratch" / str(case.id) / "stdout"
        wait_until(out.exists, what="the job to start")

    def release(self, case):
        (self.double.fs_root / "scratch" / str(case.id) / "work" / "go").write_text("")

    def job(self, case):
        return next(job for job in self.double.user_jobs() if job.name == str(case.id))

    def ended(self, case):
        wait_until(lambda: self.job(case).proc.poll() is not None, what="the job to end")

    def cancelled(self, case):
        assert self.job(case).cancelled  # scancel reached the job

    def named(self, case):
        return f"{self.job(case).job_id}@{self.double.system}"

    def remote_side(self, case):
        return ((self.double.fs_root / "scratch" / str(case.id)).is_dir(),)  # <working_root>/<case id>

    def access_tokens(self):
        return list(self.double.token_subjects)

    inputs = {"big.bin": bytes(range(256)) * 8192}  # 2 MiB: over 1 MiB, through the transfer endpoints

    def submitted(self, case):
        assert (self.workdir(case) / "big.bin").read_bytes() == self.inputs["big.bin"]
        assert any("/transfer/upload" in path for _method, path in self.double.calls)

    def workdir(self, case):
        return self.double.fs_root / "scratch" / str(case.id) / "work"

    exit_words, degraded = "exit code 3", ("debug", ["debug"])  # degraded: the pool's own partition

    def poll_path(self, case):
        return f"{self.poll_listing}$"

    def quote_refusals(self, sent):
        # Keycloak's refusal quotes nothing; an identity provider or a gateway in front of it may.
        self.double.fault(
            "/auth/token",
            status=401,
            times=20,
            body={"error": "invalid_client", "error_description": f"Invalid client credentials: {sent}"},
        )


class PastedDriver(Driver):
    """Qarnot and Run:AI: a user pastes their own credential on the connections page."""

    def paste(self, user, *values):
        fields = dict(zip(self.fields, values, strict=True))
        return browser(user).post(f"/connections/{self.pool.pk}/credential/", fields, follow=True)

    def connect(self, user):
        return [self.offer(user)]

    def offer(self, user):
        return self.paste(user, *self.credentials[user.username])

    def jobs(self):
        return len(self.store)

    def owner_of(self, case):
        return self.store[case.remote_id].owner

    def held(self, command):
        self.double.hold = {self.held_state}
        return command

    def release(self, case):
        self.double.hold = set()


class QarnotDriver(PastedDriver):
    name = kind = "qarnot"
    label_word, option, fields = "Qarnot account", "node_type", ("token",)
    choices = ([], ["8c-32g-amd-rome", "16c-64g-intel"])  # not connected: the catalogue is per account
    refused_words = ("Qarnot refused this token",)
    renews = get_status = False  # its API token is the secret itself; its SDK drops a GET's status
    disconnected = {
        "revoked": None,  # the user's own token: Gridgate forgets it, the user deletes it at Qarnot
        "detail": "Gridgate no longer holds the API token; it stays valid at the provider until its owner "
        "deletes it there.",
    }
    service_label = "service account (GRIDGATE_CRED_QARNOT_TOKEN)"
    service_owner = "gridgate@example.org"
    held_state = "FullyExecuting"
    backend, module, listing_path = QarnotBackend(), qb_client, "/profiles"
    secret, secret_env = "qarnot-TOKEN-value-9f8e7d", "GRIDGATE_CRED_QARNOT_TOKEN"  # noqa: S105
    secret_key, refused_service_words = "token", "Qarnot connection failed"
    submit_call, lookup_call = ("POST", "/tasks"), ("POST", "/tasks/paginate")  # by its tag
    state_dir, state_files = ".qarnot", frozenset({"manifest.json", "stdout.spool", "stdout.base"})
    doctor_checks = ("sdk", "credentials", "reachability", "profile", "image", "buckets", "storage")
    options_call = ("GET", "/hardware-constraints")
    resources = {"cpu": 4, "memory": 8}
    url_keys, service_env = ("cluster_url",), {"token_env": "GRIDGATE_CRED_QARNOT_TOKEN"}
    credentials = {"ada": ("qarnot-ada-PERSONAL-token-1a2b3c",), "bob": ("qarnot-bob-PERSONAL-token-4d5e6f",)}

    def __init__(self, tmp_path):
        double = QarnotDouble(token=self.secret).start()
        # moto's buckets are one store per process, shared with the other Qarnot doubles: no limit here.
        double.user = {"email": "gridgate@example.org", "maxBucket": 100_000, "quotaBytesBucket": 10 << 30}
        for name, (token,) in self.credentials.items():
            double.add_account(token, f"{name}@example.org")
        self.store = double.tasks
        remote = {"profile": "docker-batch", "cluster_url": double.url, "snapshot_interval": 1, "max_upload_mb": 1}
        super().__init__(double, remote)

    def listing(self, session):
        return session.guarded("profile listing", lambda: list(session.conn.profiles_names()))

    def refuse(self, user):
        return self.paste(user, "not-a-token-of-anyone")

    def reconnect(self, user):
        self.double.add_account(f"qarnot-{user.username}-NEW-token-777", self.subject(user))
        return [self.paste(user, f"qarnot-{user.username}-NEW-token-777")]

    def lose(self, user, how):
        self.double.revoke(self.credentials[user.username][0])  # deleted in Qarnot's console
        clear_clients()  # a new worker process: no connection kept from before

    def account(self, user):
        return f"{user.username}@example.org"

    subject = account

    def saved(self, user):
        return f"API token saved for {self.pool.name} (Qarnot account {self.subject(user)})"

    def secrets(self, user):
        return [*self.credentials[user.username], f"qarnot-{user.username}-NEW-token-777"]

    def alive(self, user):
        return self.credentials[user.username][0] in self.double.accounts

    def running(self, case):
        self.double.wait_state(case.remote_id, {self.held_state})

    def ended(self, case):
        self.double.wait_state(case.remote_id, ("Success",))

    def cancelled(self, case):
        self.double.wait_state(case.remote_id, ("Cancelled",))  # through PendingCancel, as Qarnot does

    def named(self, case):
        return next(uuid for uuid, task in self.store.items() if task.body.get("name") == str(case.id))

    def remote_side(self, case):
        buckets = set(self.double.buckets())
        return (*(name in buckets for name in bucket_names(str(case.id))), case.remote_id in self.store)

    def access_tokens(self):
        return []  # the API token is the secret itself

    def submitted(self, case):
        task = self.store[case.remote_id]
        assert task.snapshot_whitelist and task.snapshot_interval == 1  # live files come from snapshots

    def workdir(self, case):
        return self.double._scratch / case.remote_id

    # Built from the per-instance errors Qarnot reports in ``completedInstances`` (the SDK drops
    # them; there is no exit code in ``errors``).
    exit_words, degraded = "instance 0: The process exited with code 3", (None, [])

    def poll_path(self, case):
        return f"/tasks/{case.remote_id}"

    def quote_refusals(self, sent):
        # The SDK drops a 401's body; its 403s carry the API's message.
        self.double.fault("/", status=403, times=20, body={"message": f"Forbidden for token {sent}"})


class RunaiDriver(PastedDriver):
    name = kind = "runai"
    label_word, option, fields = "subject", "node_pool", ("client_id", "client_secret")
    choices = ([], ["default", "a100"])  # not connected: the pool names none; team-a's once connected
    refused_words = ("Run:AI refused this access key",)
    disconnected = {
        "revoked": None,
        "detail": "Gridgate no longer holds the access key; it stays valid at the provider until its owner "
        "deletes it there.",
    }
    losses = ("revoked", "expired")
    service_label = "service account (GRIDGATE_CRED_RUNAI_CLIENT_ID)"
    service_owner = "svc-gridgate"
    held_state = "Running"
    backend, module, listing_path = RunaiBackend(), rb_client, "/api/v1/org-unit/projects"
    secret, secret_env = "runai-SVC-secret-6e5d4c", "GRIDGATE_CRED_RUNAI_CLIENT_SECRET"  # noqa: S105
    secret_key, refused_service_words = "client_secret", "401"
    submit_call, lookup_call = ("POST", "/api/v1/workloads/trainings"), ("GET", "/api/v1/workloads")
    state_dir, state_files = ".runai", frozenset({"manifest.json"})
    doctor_checks = ("sdk", "shared volume", "credentials", "token", "project", "cluster")
    options_call = ("GET", "/api/v1/org-unit/projects")
    resources = {"cpu": 2, "memory": 4, "gpu": 1}
    echoes = True
    url_keys = ("base_url",)  # the access key goes to its token endpoint, the tokens to its API
    service_env = {
        "client_id_env": "GRIDGATE_CRED_RUNAI_CLIENT_ID",
        "client_secret_env": "GRIDGATE_CRED_RUNAI_CLIENT_SECRET",
    }
    credentials = {
        "ada": ("ada-key", "runai-ada-PERSONAL-secret-1a2b3c"),
        "bob": ("bob-key", "runai-bob-PERSONAL-secret-4d5e6f"),
    }

    def __init__(self, tmp_path):
        double = RunaiDouble(client_id="gridgate-svc", client_secret=self.secret).start()
        for name, (client_id, secret) in self.credentials.items():
            double.add_client(client_id, secret, f"{name}-subject", f"{name}@example.org")
        self.store = double.workloads
        volume = tmp_path / "volume"
        volume.mkdir(mode=0o755)
        remote = {
            "base_url": double.url,
            "project": "team-a",
            "image": "registry.example.org/solver:1.2",
            "working_root": str(volume),
            "host_path": str(volume),
        }
        super().__init__(double, remote)

    def listing(self, session):
        return rb_client.projects(session)

    def refuse(self, user):
        return self.paste(user, self.credentials[user.username][0], "not-the-secret")

    def reconnect(self, user):
        self.double.echo_credentials = 0
        client_id, secret = f"{user.username}-key-2", f"runai-{user.username}-RENEWED-secret-7a8b9c"
        self.double.add_client(client_id, secret, self.subject(user), f"{user.username}@example.org")
        return [self.paste(user, client_id, secret)]

    def lose(self, user, how):
        client_id = self.credentials[user.username][0]
        if how == "revoked":
            self.double.revoke_client(client_id)  # deleted in Run:AI's user settings; the worker keeps its client
        else:
            self.double.expire_client(client_id)
            self.double.expire_tokens()  # and the last token ran out
            clear_clients()  # a new worker process
        self.double.echo_credentials = 10  # the refusals echo the key's secret, which never shows

    def account(self, user):
        return f"{user.username}-subject"

    subject = account

    def saved(self, user):
        return f"Access key saved for {self.pool.name} (Run:AI account {user.username}@example.org)"

    def sealed_opens_to(self, user):
        client_id, secret = self.credentials[user.username]
        return json.dumps({"client_id": client_id, "client_secret": secret}, sort_keys=True)

    def secrets(self, user):
        return [self.credentials[user.username][1], f"runai-{user.username}-RENEWED-secret-7a8b9c"]

    def alive(self, user):
        return self.credentials[user.username][0] in self.double.clients

    def running(self, case):
        self.double.wait_phase(case.remote_id, {self.held_state})

    def ended(self, case):
        self.double.wait_phase(case.remote_id, {"Completed"})

    def cancelled(self, case):
        workload = self.store[case.remote_id]
        assert ("DELETE", f"/api/v1/workloads/trainings/{workload.id}") in self.double.calls
        wait_until(lambda: workload.deleted, what="deletion")
        assert workload.proc.poll() is not None  # its pod is gone

    def named(self, case):
        return next(workload.id for workload in self.store.values() if workload.name == f"gg-{case.id}")

    def remote_side(self, case):
        workload = self.store[case.remote_id]
        kept = not workload.deleted and workload.phase != "Deleting"  # deleted a tick after the DELETE
        return Path(self.pool.remote["working_root"], str(case.id)).is_dir(), kept

    def access_tokens(self):
        return list(self.double.tokens)

    def submitted(self, case):
        workload = self.store[case.remote_id]
        assert workload.name == f"gg-{case.id}" and workload.project["name"] == "team-a"

    def workdir(self, case):
        return Path(self.pool.remote["working_root"], str(case.id), "work")

    exit_words, degraded = "container exited with code 3", (None, [])  # its phaseMessage

    def poll_path(self, case):
        return f"/api/v1/workloads/{case.remote_id}$"

    def quote_refusals(self, sent):
        self.double.echo_credentials = 20


#: every remote provider's driver, by pool kind: the contract tests run over them all
DRIVERS = {"firecrest": FirecrestDriver, "qarnot": QarnotDriver, "runai": RunaiDriver}
#: those whose users paste their credential (their session's ``paste``)
PASTED = [name for name, made in DRIVERS.items() if made.module.Session.paste is not None]


@pytest.fixture
def driver(request, tmp_path, monkeypatch, settings, db):
    """A provider's :class:`Driver`: ``request.param`` names it (an indirect parametrize), else the
    module's ``PROVIDER``."""
    yield from driving(getattr(request, "param", None) or request.module.PROVIDER, tmp_path, monkeypatch, settings)


@pytest.fixture
def double(driver):
    """The driver's loopback double (the doubles' own tests start theirs)."""
    return driver.double


def driving(name, tmp_path, monkeypatch, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = [SEALING_KEY]
    monkeypatch.setenv("GRIDGATE_CRED_FC_ID", "gridgate-client")
    monkeypatch.setenv("GRIDGATE_CRED_FC_SECRET", FirecrestDriver.secret)
    monkeypatch.setenv("GRIDGATE_CRED_QARNOT_TOKEN", QarnotDriver.secret)
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_ID", "gridgate-svc")
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_SECRET", RunaiDriver.secret)
    monkeypatch.setattr(fc_client, "TIMEOUT", 5.0)
    monkeypatch.setattr(fc_backend, "FIND_AFTER_TIMEOUT_SLEEP", 0.05)
    monkeypatch.setattr(qb_client, "RETRY_WAIT", 0.01)
    monkeypatch.setattr(qb_client, "TIMEOUT", 3)
    monkeypatch.setattr(rb_client, "BACKOFF", 0.01)
    rb_client._classes.clear()  # the retry policy is built from BACKOFF
    clear_clients()
    credential_services.forget_access_tokens()
    made = DRIVERS[name](tmp_path)
    yield made
    made.double.reap()
    made.double.stop()
    clear_clients()
    rb_client._classes.clear()
    credential_services.forget_access_tokens()
    # The double refused and recorded every call about a case made with another credential than
    # its owner's: there must be none.
    assert made.double.violations == []
