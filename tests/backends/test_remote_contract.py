"""The remote-provider contract (``apps.backends.remote``), proved once for every provider against
its loopback double with the real SDK: R-CRED-1, the 401 renewal, error facts as attributes,
scrubbing of every form of a secret, and the doctor skeleton. Each provider's own module tests
only what is its own."""

import base64
import json
from dataclasses import dataclass, field
from urllib.parse import quote

import pytest

from apps.backends.base import BackendError, CredentialsRequired, JobRef, RemoteIdentity
from apps.backends.firecrest import client as fc_client
from apps.backends.firecrest.backend import FirecrestBackend
from apps.backends.qarnot import client as qb_client
from apps.backends.qarnot.backend import QarnotBackend
from apps.backends.remote import ProviderError, clear_clients
from apps.backends.remote_common import secret_forms
from apps.backends.runai import client as rb_client
from apps.backends.runai.backend import RunaiBackend
from apps.resources.models import ResourcePool
from tests.doubles.firecrest_server import FirecrestDouble
from tests.doubles.qarnot_server import QarnotDouble
from tests.doubles.runai_server import RunaiDouble

pytestmark = pytest.mark.django_db

FC_SECRET = "s3cr3t-client-VALUE-42"
QARNOT_TOKEN = "qarnot-TOKEN-value-9f8e7d"
RUNAI_SECRET = "runai-SVC-secret-6e5d4c"


@dataclass
class Provider:
    """One provider as the contract sees it: its double, a service pool, one cheap listing."""

    name: str
    double: object
    backend: object
    module: object  # its client.py
    remote: dict  # the service pool's remote
    secret: str  # the service credential's secret value
    secret_env: str
    listing_path: str  # the double's path of the listing below
    renews: bool  # a 401 is answered with a fresh token and one more try
    user_remote: dict = field(default_factory=dict)

    def pool(self, **extra) -> ResourcePool:
        return ResourcePool.objects.create(name=f"{self.name}-svc", kind=self.name, remote={**self.remote, **extra})

    def session(self, pool, identity=None):
        return self.module.Session(pool.remote_config(), identity=identity)

    def listing(self, session):
        if self.name == "firecrest":
            return session.call("system listing", "systems")
        if self.name == "qarnot":
            return session.guarded("profile listing", lambda: list(session.conn.profiles_names()))
        return rb_client.projects(session)

    def token_requests(self) -> int:
        return sum(1 for _method, path in list(self.double.calls) if "token" in path)


def _firecrest(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDGATE_CRED_FC_ID", "gridgate-client")
    monkeypatch.setenv("GRIDGATE_CRED_FC_SECRET", FC_SECRET)
    monkeypatch.setattr(fc_client, "TIMEOUT", 2.0)
    double = FirecrestDouble(tmp_path / "hpc", client_secret=FC_SECRET).start()
    remote = {
        "api_url": double.url,
        "token_uri": double.token_uri,
        "system_name": double.system,
        "partition": "debug",
        "working_root": str(double.fs_root / "scratch"),
        "client_id_env": "GRIDGATE_CRED_FC_ID",
        "client_secret_env": "GRIDGATE_CRED_FC_SECRET",
        "credentials": "service",
    }
    user_remote = {**remote, "credentials": "user"}
    return Provider(
        "firecrest", double, FirecrestBackend(), fc_client, remote, FC_SECRET, "GRIDGATE_CRED_FC_SECRET",
        "/status/systems", True, user_remote,
    )  # fmt: skip


def _qarnot(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDGATE_CRED_QARNOT_TOKEN", QARNOT_TOKEN)
    monkeypatch.setattr(qb_client, "RETRY_WAIT", 0.01)
    monkeypatch.setattr(qb_client, "TIMEOUT", 2)
    double = QarnotDouble(token=QARNOT_TOKEN).start()
    remote = {
        "profile": "docker-batch",
        "cluster_url": double.url,
        "token_env": "GRIDGATE_CRED_QARNOT_TOKEN",
        "credentials": "service",
    }
    return Provider(
        "qarnot", double, QarnotBackend(), qb_client, remote, QARNOT_TOKEN, "GRIDGATE_CRED_QARNOT_TOKEN",
        "/profiles", False, {**remote, "credentials": "user"},
    )  # fmt: skip


def _runai(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_ID", "gridgate-svc")
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_SECRET", RUNAI_SECRET)
    monkeypatch.setattr(rb_client, "BACKOFF", 0.01)
    monkeypatch.setattr(rb_client, "TIMEOUT", 2)
    rb_client._classes.clear()  # the retry policy is built from BACKOFF
    double = RunaiDouble(client_id="gridgate-svc", client_secret=RUNAI_SECRET).start()
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o755)
    remote = {
        "base_url": double.url,
        "project": "team-a",
        "image": "registry.example.org/solver:1.2",
        "working_root": str(volume),
        "host_path": str(volume),
        "client_id_env": "GRIDGATE_CRED_RUNAI_CLIENT_ID",
        "client_secret_env": "GRIDGATE_CRED_RUNAI_CLIENT_SECRET",
        "credentials": "service",
    }
    return Provider(
        "runai", double, RunaiBackend(), rb_client, remote, RUNAI_SECRET, "GRIDGATE_CRED_RUNAI_CLIENT_SECRET",
        "/api/v1/org-unit/projects", True, {**remote, "credentials": "user"},
    )  # fmt: skip


@pytest.fixture(params=["firecrest", "qarnot", "runai"])
def provider(request, tmp_path, monkeypatch):
    clear_clients()
    made = {"firecrest": _firecrest, "qarnot": _qarnot, "runai": _runai}[request.param](tmp_path, monkeypatch)
    yield made
    made.double.stop()
    clear_clients()
    rb_client._classes.clear()


def only(*names):
    """Skip the providers the rule does not apply to (they say why in their own tests)."""

    def check(provider):
        if provider.name not in names:
            pytest.skip(f"{provider.name}: not part of this rule")

    return check


# -- R-CRED-1 ------------------------------------------------------------------------------------
def test_r_cred_1_a_per_user_pool_never_acts_under_the_service_account(provider, tmp_path):
    """Without the case owner's identity (none, or the service's) nothing is sent at all, though
    the service credential is right there in the environment."""
    calls = len(provider.double.calls)
    service = RemoteIdentity(RemoteIdentity.SERVICE, "service account", key="service")
    for identity in (None, service):
        remote_id = "1@cluster" if provider.name == "firecrest" else "w-1"
        job = JobRef("c1", remote_id, tmp_path, provider.user_remote, identity=identity)
        with pytest.raises(BackendError, match="R-CRED-1"):
            provider.backend.poll(job)
        with pytest.raises(BackendError, match="R-CRED-1"):
            provider.backend.cancel(job)
    assert len(provider.double.calls) == calls


# -- the 401 rule --------------------------------------------------------------------------------
def test_a_401_gets_a_fresh_token_and_exactly_one_more_try(provider):
    only("firecrest", "runai")(provider)
    session = provider.session(provider.pool())
    assert provider.listing(session)
    tokens = provider.token_requests()
    provider.double.fault(provider.listing_path, status=401, times=1, method="GET")
    assert provider.listing(session)  # refused, renewed, repeated
    assert provider.token_requests() == tokens + 1
    provider.double.fault(provider.listing_path, status=401, times=2, method="GET")
    with pytest.raises(ProviderError) as refused:
        provider.listing(session)
    assert refused.value.status == 401


def test_a_credential_the_provider_refuses_asks_its_user_to_reconnect(provider, tmp_path):
    """A per-user credential refused by the provider itself marks the connection failed (the
    identity's ``refused``) and the call raises CredentialsRequired with its message."""
    only("qarnot", "runai")(provider)
    marked = []
    token = json.dumps({"client_id": "nobody", "client_secret": "wrong"}) if provider.name == "runai" else "nobody"
    identity = RemoteIdentity(
        RemoteIdentity.USER, "user ada", key="ada", token=lambda fresh=False: token,
        refused=lambda: marked.append(1) or "reconnect at /connections/",
    )  # fmt: skip
    pool = ResourcePool.objects.create(name="u", kind=provider.name, remote=provider.user_remote)
    with pytest.raises(CredentialsRequired, match="reconnect at /connections/"):
        provider.listing(provider.session(pool, identity))
    assert marked == [1]


# -- error facts and scrubbing ---------------------------------------------------------------------
def test_a_provider_error_carries_its_facts_as_attributes_and_names_the_call(provider):
    session = provider.session(provider.pool())
    provider.listing(session)  # signed in
    provider.double.fault(provider.listing_path, status=404, times=5, method="GET")
    with pytest.raises(ProviderError) as failed:
        provider.listing(session)
    label = provider.module.Session.label
    assert str(failed.value).startswith(f"{label} ") and " listing failed: " in str(failed.value)
    assert failed.value.status == 404 or provider.name == "qarnot"  # qarnot's SDK drops a GET's status
    assert not failed.value.timeout


def test_no_answer_in_time_is_a_transient_timeout(provider):
    session = provider.session(provider.pool())
    provider.listing(session)
    provider.double.fault(provider.listing_path, delay=3.5, times=5, method="GET")
    with pytest.raises(ProviderError) as late:
        provider.listing(session)
    assert late.value.timeout and late.value.transient


def test_every_form_of_a_secret_is_scrubbed_from_every_message_and_log(provider, caplog):
    session = provider.session(provider.pool())
    session.credential()
    secret = provider.secret
    echoed = RuntimeError(
        f"as is {secret}, encoded {quote(secret, safe='')}, json {json.dumps(secret)}, "
        f"basic {base64.b64encode(f'id:{secret}'.encode()).decode()} {base64.b64encode(secret.encode()).decode()}"
    )
    message = str(session.error("job lookup", echoed))
    assert message.startswith(f"{session.label} job lookup failed: ")
    for form in secret_forms([secret]):
        assert form not in message and form not in caplog.text
    assert "***" in message or "(reference " in message  # a service pool's users never read its words


# -- doctor ----------------------------------------------------------------------------------------
def test_doctor_without_a_pool_checks_the_sdk_only(provider):
    checks = provider.backend.doctor(None)
    assert [(c.name, c.ok) for c in checks] == [("sdk", True), ("pool", True)]


def test_doctor_of_a_service_pool_passes_and_never_prints_the_secret(provider):
    checks = provider.backend.doctor(provider.pool())
    assert [c.name for c in checks if not c.ok] == []
    assert ("credentials", True) in [(c.name, c.ok) for c in checks]
    assert not any(provider.secret in c.message for c in checks)


def test_doctor_stops_at_a_missing_service_credential_naming_its_variable(provider, monkeypatch):
    monkeypatch.delenv(provider.secret_env)
    calls = len(provider.double.calls)
    checks = provider.backend.doctor(provider.pool())
    assert checks[-1].name == "credentials" and not checks[-1].ok
    assert provider.secret_env in checks[-1].message
    assert len(provider.double.calls) == calls


def test_doctor_of_a_per_user_pool_needs_the_sealing_key(provider, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = []
    pool = ResourcePool.objects.create(name="u", kind=provider.name, remote=provider.user_remote)
    credentials = next(c for c in provider.backend.doctor(pool) if c.name == "credentials")
    assert not credentials.ok and "GRIDGATE_CREDENTIALS_KEY" in credentials.message


def test_f18_scrub_covers_every_form_a_provider_echoes_a_secret_in():
    """F18: percent-encoded (either case), form-encoded, JSON-escaped and Basic-base64 forms."""
    import base64
    import json as json_module
    from urllib.parse import quote, quote_plus

    from apps.backends.remote_common import scrub

    secret, client = 'p@ss/w+rd=&"x"', "client-7"
    echoes = [
        secret,
        quote(secret, safe=""),
        quote(secret, safe="").lower(),
        quote_plus(secret),
        json_module.dumps(secret)[1:-1],
        base64.b64encode(f"{client}:{secret}".encode()).decode(),
        base64.b64encode(secret.encode()).decode(),
    ]
    for echo in echoes:
        scrubbed = scrub(f"body: {echo} end", [client, secret])
        assert echo.rstrip("=") not in scrubbed and "***" in scrubbed, (echo, scrubbed)
