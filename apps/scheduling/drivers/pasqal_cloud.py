"""The ``pasqal_cloud`` driver: Pasqal Cloud (remote QPUs and cloud emulators) through the
``pasqal-cloud`` SDK.

A Gridgate job becomes a Pasqal Cloud job of ``shots`` runs on the configured device type, in a
closed batch of its own, or, with ``open_batches``, in one batch left open for the whole session:
the session's jobs are added to it as they come (Pasqal Cloud keeps the batch on the device
between them) and it is closed when the session ends. Polls read the job, its counts come from
the job's results; cancel cancels the job.

Device ``config``:
- ``project_id``: the Pasqal Cloud project the batches are billed to;
- ``device_type``: a Pasqal Cloud device type (``FRESNEL``, ``EMU_MPS``, ``EMU_FREE``, …);
- credentials, from the environment only: ``username_env`` and ``password_env`` (the names of
  the variables holding them), or ``token_env`` (a ready bearer token);
- ``pulser_device``: for a cloud emulator whose specs Pasqal Cloud does not publish, the Pulser
  device sequences must be built for (default: the specs Pasqal Cloud gives for the device type);
- ``endpoint``, ``account_endpoint``, ``token_endpoint``: other API and authentication URLs
  (another region, or a test double); Pasqal Cloud's own by default;
- ``open_batches``: ``true`` to stream each session's jobs into one open batch (default false).

SDK errors map to the scheduler's: a 5xx, 408, 429, a lost connection or a failed token request
is transient (the job goes back to the queue, R-JOB-3); another 4xx is permanent. The SDK's own
exceptions derive from ``BaseException``, hence the explicit list below.

Lost answers: the intent is recorded before every request that creates a job (``DriverRun``,
``submitting``), the batch a job creates carries the tag ``gridgate-job-<id>``, and every job's
sequence is named ``gridgate-job-<id>``. A later attempt whose first answer was lost looks the
job up (the batch by its tag, or the job in the open batch it was added to by its sequence's
name) and adopts it instead of sending it again. A batch Pasqal Cloud no longer takes jobs in
(closed, timed out) is recorded closed and the job opens the session's next one.
"""

import json
import logging
import warnings
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.core import credentials
from apps.core.exceptions import Unavailable
from apps.core.tasks import enqueue
from apps.scheduling.drivers.base import (
    DeviceDriver,
    DriverState,
    PermanentDriverError,
    ProviderStatus,
    TransientDriverError,
)
from apps.scheduling.drivers.emulator import configured_device
from apps.scheduling.drivers.emulator import pulser_device as named_pulser_device
from apps.scheduling.drivers.sequences import provider_device, specs_problem, validate_sequence
from apps.scheduling.models import DriverRun, OpenBatch

log = logging.getLogger(__name__)

KNOWN = {
    "project_id",
    "device_type",
    "username_env",
    "password_env",
    "token_env",
    "pulser_device",
    "endpoint",
    "account_endpoint",
    "token_endpoint",
    "open_batches",
}
TRANSIENT_STATUS = {408, 425, 429}
STATES = {"PENDING": "running", "RUNNING": "running", "DONE": "completed", "ERROR": "failed", "CANCELED": "cancelled"}
STATES |= {"CANCELING": "running", "TIMED_OUT": "failed", "PAUSED": "running"}


def device_types() -> list[str]:
    from pasqal_cloud.device import DeviceTypeName

    return sorted(d.value for d in DeviceTypeName)


def run_tag(job) -> str:
    return f"gridgate-job-{job.pk}"


def sdk_errors() -> tuple:
    """The SDK's exceptions (BaseException subclasses) and the transport's."""
    import requests
    from pasqal_cloud.authentication import TokenProviderError
    from pasqal_cloud.errors import DeviceSpecsException, ExceptionWithResponseContext

    return (ExceptionWithResponseContext, DeviceSpecsException, TokenProviderError, requests.RequestException)


def mapped(exc: BaseException, doing: str) -> Exception:
    """R-JOB-3: the scheduler's error for an SDK failure (facts from the HTTP status, not text)."""
    import requests
    from pasqal_cloud.authentication import TokenProviderError

    # The SDK wraps the HTTPError, some of its errors as the cause, others only as the context.
    response = getattr(exc, "response", None) or getattr(exc.__cause__ or exc.__context__, "response", None)
    status = getattr(response, "status_code", None)
    summary = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    message = f"Pasqal Cloud, {doing}: {summary}"
    transient = (
        status is None
        or status >= 500
        or status in TRANSIENT_STATUS
        or isinstance(exc, (TokenProviderError, requests.ConnectionError, requests.Timeout))
    )
    return TransientDriverError(message) if transient else PermanentDriverError(message)


def token_provider(token: str):
    """The SDK's ``token_provider`` for a bearer token taken from the environment."""
    from pasqal_cloud.authentication import TokenProvider

    class EnvToken(TokenProvider):
        def get_token(self) -> str:
            return token

    return EnvToken()


def client(config: dict):
    """A PasqalCloudClient with the device's credentials, read from the environment now."""
    from pasqal_cloud.endpoints import Endpoints, TokenProviderConf
    from pasqal_cloud.pasqal_cloud_client import PasqalCloudClient

    def env(key: str) -> str:
        try:
            return credentials.read(config.get(key), f"Pasqal Cloud {key[:-4]}", pool=credentials.pool_of(config))
        except credentials.CredentialError as exc:  # names the variable, never a value
            raise TransientDriverError(str(exc)) from None

    kwargs = {"project_id": config["project_id"]}
    if config.get("endpoint"):
        defaults = Endpoints()
        kwargs["endpoints"] = Endpoints(
            core=config["endpoint"], account=config.get("account_endpoint", defaults.account)
        )
    if config.get("token_env"):
        kwargs["token_provider"] = token_provider(env("token_env"))
    else:
        kwargs["username"], kwargs["password"] = env("username_env"), env("password_env")
        if config.get("token_endpoint"):
            base = TokenProviderConf.from_region(None)
            kwargs["auth_config"] = TokenProviderConf(
                token_endpoint=config["token_endpoint"],
                public_client_id=base.public_client_id,
                audience=base.audience,
                realm=base.realm,
                grant_type=base.grant_type,
            )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK's own end-of-support notice
        try:
            return PasqalCloudClient(**kwargs)
        except sdk_errors() as exc:  # username/password: the SDK asks for a token at once
            raise mapped(exc, "signing in") from None


def named(sequence, tag: str) -> str:
    """The sequence as sent, named after its run (Pulser's abstract representation has a free
    ``name``): how a job added to an open batch is told apart from the batch's others when the
    answer to its addition was lost."""
    data = json.loads(sequence) if isinstance(sequence, str) else dict(sequence)
    return json.dumps({**data, "name": tag})


def ours(sdk, batch_id: str, tag: str, jobs) -> str | None:
    """The id of the job named ``tag`` among a batch's jobs, looking only at jobs no run of
    this batch recorded yet (usually one: the last added)."""
    recorded = set(
        DriverRun.objects.filter(batch_id=batch_id).exclude(external_id="").values_list("external_id", flat=True)
    )
    for job in reversed(jobs):
        if job.id not in recorded and json.loads(job.sequence or "{}").get("name") == tag:
            return job.id
    return None


def open_batch_for(device, job, tag: str) -> OpenBatch | None:
    """The session's open batch on the device; one is reserved for this run to create when
    there is none. None when another run is creating it right now: this job goes alone."""
    batch = OpenBatch.objects.filter(device=device, session_id=job.session_id, closed_at=None).first()
    if batch is None:
        try:
            with transaction.atomic():
                return OpenBatch.objects.create(device=device, session_id=job.session_id, creator=tag)
        except IntegrityError:
            return None
    return batch if batch.batch_id or batch.creator == tag else None


def close_at_provider(device, batch_id: str) -> bool:
    """Close ``batch_id`` at Pasqal Cloud: True once it is closed (or it had closed or timed out
    already), False when Pasqal Cloud could not be reached (to be tried again)."""
    try:
        client(device.credential_config()).close_batch(batch_id)
    except TransientDriverError as exc:
        log.warning("Pasqal Cloud batch %s not closed yet: %s", batch_id, exc)
        return False
    except sdk_errors() as exc:
        error = mapped(exc, f"closing batch {batch_id}")
        if isinstance(error, TransientDriverError):
            log.warning("%s: tried again on the next tick", error)
            return False
    return True


def close_ended_batches() -> int:
    """Close the open batches of sessions that ended (a task, enqueued by the tick when there
    are some): Pasqal Cloud then runs what the batch holds and takes no more jobs. A failure to
    reach it is tried again on the next tick; a batch it already closed or timed out is done.

    A row with no batch id yet is a batch being created (its creator awaits Pasqal Cloud's
    answer): it is closed in the database alone, by a compare-and-set on the blank id. If the
    creator records the id first, the set fails and the next pass closes the batch at Pasqal
    Cloud; if the set comes first, the creator finds its row closed and closes the batch itself
    (``PasqalCloudDriver._record``). Either way the batch is closed there, never left open
    holding the device with no row left to close it."""
    closed = 0
    for batch in OpenBatch.objects.filter(closed_at=None).exclude(session__status="active").select_related("device"):
        if batch.batch_id and not close_at_provider(batch.device, batch.batch_id):
            continue
        closed += OpenBatch.objects.filter(pk=batch.pk, batch_id=batch.batch_id, closed_at=None).update(
            closed_at=timezone.now()
        )
    return closed


def enqueue_batch_closes() -> bool:
    """The tick's part: one task when a session with an open batch has ended."""
    if OpenBatch.objects.filter(closed_at=None).exclude(session__status="active").exists():
        enqueue("apps.scheduling.tasks.close_open_batches")
        return True
    return False


def _seconds(start, end) -> float | None:
    try:
        return max((datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return None


class PasqalCloudDriver(DeviceDriver):
    name = "pasqal_cloud"
    has_provider = True

    def validate_config(self, config):
        problems = [f"unknown key '{k}' for the pasqal_cloud driver" for k in config if k not in KNOWN]
        if not isinstance(config.get("project_id"), str) or not config.get("project_id", "").strip():
            problems.append("'project_id' must be your Pasqal Cloud project's id")
        if config.get("device_type") not in device_types():
            problems.append(f"'device_type' must be one of {', '.join(device_types())}")
        with_token = "token_env" in config
        with_password = "username_env" in config or "password_env" in config
        if with_token == with_password or (with_password and not {"username_env", "password_env"} <= set(config)):
            problems.append(
                "give either 'token_env', or 'username_env' and 'password_env' (environment variable names)"
            )
        for key in ("token_env", "username_env", "password_env"):
            if key in config and credentials.name_problem(config[key]):
                problems.append(f"'{key}' {credentials.name_problem(config[key])}")
        if "pulser_device" in config and (
            not isinstance(config["pulser_device"], str) or named_pulser_device(config["pulser_device"]) is None
        ):
            problems.append("'pulser_device' must name a Pulser device")
        if not isinstance(config.get("open_batches", False), bool):
            problems.append("'open_batches' must be true or false")
        for key in ("endpoint", "account_endpoint", "token_endpoint"):
            value = config.get(key)
            if value is not None and (not isinstance(value, str) or not value.startswith(("https://", "http://"))):
                problems.append(f"'{key}' must be an http(s) URL")
        return problems

    # -- specs and status ------------------------------------------------------------------
    def pulser_device(self, device):
        config = device.credential_config()
        if device.provider_specs:
            return provider_device(device.provider_specs, where=f"device '{device.name}'")
        if config.get("pulser_device"):
            return configured_device(device, config["pulser_device"])
        raise Unavailable(
            f"The specs of device '{device.name}' are not known yet: the worker reads them from Pasqal Cloud on its "
            "status pass. Try again shortly."
        )

    def specs(self, device):
        return json.loads(self.pulser_device(device).to_abstract_repr())

    def specs_text(self, device):
        device_specs = self.pulser_device(device)  # 503 until known
        return (device.provider_specs and device.provider_specs_text) or device_specs.to_abstract_repr()

    def validate_payload(self, device, payload, shots):
        """R-DEV-1 against the device type's specs as Pasqal Cloud publishes them."""
        validate_sequence(payload, shots, self.pulser_device(device), where=f"device '{device.name}'")

    def check_status(self, device):
        """Up while Pasqal Cloud offers the device type to the project (its specs are listed);
        cloud emulators without published specs are up while the API answers."""
        config = device.credential_config()
        try:
            specs = client(config).get_device_specs_dict()
        except TransientDriverError as exc:
            return ProviderStatus("unreachable", message=str(exc))
        except sdk_errors() as exc:
            return ProviderStatus("unreachable", message=str(mapped(exc, "reading device specs")))
        raw = specs.get(config["device_type"]) if isinstance(specs, dict) else None
        if raw is None:
            if config.get("pulser_device"):
                return ProviderStatus("up", message=f"{config['device_type']}: cloud emulator")
            return ProviderStatus("down", message=f"Pasqal Cloud does not offer {config['device_type']} now")
        try:
            parsed = json.loads(raw) if isinstance(raw, str) else raw
            problem = specs_problem(parsed)
        except Exception as exc:
            return ProviderStatus("down", message=f"unreadable specs for {config['device_type']}: {type(exc).__name__}")
        if problem:
            return ProviderStatus("down", message=f"{config['device_type']}: {problem}")
        text = raw if isinstance(raw, str) else json.dumps(raw)  # Pasqal Cloud's own text, kept as sent
        return ProviderStatus(
            "up", message=f"{config['device_type']} offered by Pasqal Cloud", specs=parsed, specs_text=text
        )

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, device, job):
        from pasqal_cloud.device import DeviceTypeName

        config = device.credential_config()
        tag = run_tag(job)
        run, _ = DriverRun.objects.get_or_create(
            remote_id=tag, defaults={"device": device, "payload": job.payload, "shots": job.shots, "status": "prepared"}
        )
        if run.external_id:
            return run.external_id
        sdk = client(config)
        try:
            if run.status == "submitting":  # an earlier attempt left and its answer was lost
                found = self._find_lost(sdk, device, run)
                if found:
                    log.warning("lost submission %s found on Pasqal Cloud as job %s: adopted", tag, found[0])
                    return self._record(device, run, *found)
            batch = open_batch_for(device, job, tag) if config.get("open_batches") else None
            if batch is not None and batch.batch_id:
                found = self._add(sdk, device, job, run, batch)
                if found:
                    return self._record(device, run, *found)
                batch = open_batch_for(device, job, tag)  # that batch had been closed: a new one
            DriverRun.objects.filter(pk=tag).update(status="submitting", batch_id="")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                created = sdk.create_batch(
                    None,
                    jobs=[{"runs": job.shots, "serialized_sequence": named(job.payload["sequence"], tag)}],
                    open=batch is not None and batch.creator == tag,
                    device_type=DeviceTypeName(config["device_type"]),
                    tags=[tag],
                )
        except sdk_errors() as exc:
            raise mapped(exc, "submitting the job") from None
        return self._record(device, run, created.ordered_jobs[0].id, created.id if created.open else "")

    def _add(self, sdk, device, job, run, batch) -> tuple[str, str] | None:
        """Add the job to the session's open batch; None when Pasqal Cloud no longer takes jobs
        in it (closed, or timed out for want of jobs), which is then recorded closed."""
        from pasqal_cloud.errors import JobCreationError

        DriverRun.objects.filter(pk=run.pk).update(status="submitting", batch_id=batch.batch_id)
        try:
            answer = sdk.add_jobs(
                batch.batch_id, [{"runs": job.shots, "serialized_sequence": named(job.payload["sequence"], run.pk)}]
            )
        except JobCreationError as exc:
            error = mapped(exc, f"adding a job to batch {batch.batch_id}")
            if isinstance(error, TransientDriverError) or sdk.get_batch(batch.batch_id).open:
                raise error from None
            log.info("%s: the batch no longer takes jobs, the session's next one is opened", error)
            OpenBatch.objects.filter(pk=batch.pk).update(closed_at=timezone.now())
            return None
        job_id = ours(sdk, batch.batch_id, run.pk, answer.ordered_jobs)
        if job_id is None:  # the batch answered without it: never added, so never sent twice
            raise TransientDriverError(f"Pasqal Cloud did not list job {run.pk} in batch {batch.batch_id}.")
        return job_id, batch.batch_id

    def _find_lost(self, sdk, device, run) -> tuple[str, str] | None:
        """The job an attempt whose answer was lost left on Pasqal Cloud: in the open batch it
        was added to (told apart by its sequence's name), or the batch it created (by its tag)."""
        from pasqal_cloud.utils.filters import BatchFilters

        if run.batch_id:
            job_id = ours(sdk, run.batch_id, run.pk, sdk.get_batch(run.batch_id).ordered_jobs)
            return (job_id, run.batch_id) if job_id else None
        found = sdk.get_batches(filters=BatchFilters(tag=run.pk)).results
        if not found:
            return None
        return found[0].ordered_jobs[0].id, found[0].id if found[0].open else ""

    def _record(self, device, run, job_id: str, batch_id: str = "") -> str:
        DriverRun.objects.filter(pk=run.pk).update(external_id=str(job_id), batch_id=batch_id, status="submitted")
        if batch_id:  # the batch this run opened, now known
            opened = OpenBatch.objects.filter(creator=run.pk, batch_id="", closed_at=None).update(batch_id=batch_id)
            # The session ended while this run created the batch, and the closing pass closed its
            # row with no batch to close yet (close_ended_batches): the batch is closed here, or,
            # when Pasqal Cloud cannot be reached, its row is opened again for the next pass.
            late = not opened and OpenBatch.objects.filter(creator=run.pk, batch_id="").update(batch_id=batch_id)
            if late and not close_at_provider(device, batch_id):
                OpenBatch.objects.filter(creator=run.pk, batch_id=batch_id).update(closed_at=None)
        return str(job_id)

    def poll(self, device, remote_id):
        sdk = client(device.credential_config())
        try:
            job = sdk.get_job(remote_id)
            status = str(job.status).upper()
            state = STATES.get(status)
            if state is None:
                raise TransientDriverError(
                    f"Pasqal Cloud reported an unknown status '{status[:40]}' for job {remote_id}."
                )
            if state == "running":
                return DriverState("running", started=status == "RUNNING")
            logs = f"Pasqal Cloud job {remote_id}: {status}\n"
            took = _seconds(job.start_timestamp, job.end_timestamp)
            if state == "completed":
                counter = job.result
                if not isinstance(counter, dict):
                    return DriverState(
                        "failed", error="Pasqal Cloud gave no counts for the job.", logs=logs, started=True
                    )
                counts = {str(k): int(v) for k, v in sorted(counter.items())}
                return DriverState(
                    "completed", result={"counts": counts}, runtime_seconds=took, logs=logs, started=True
                )
        except sdk_errors() as exc:
            raise mapped(exc, f"reading job {remote_id}") from None
        if state == "failed":
            errors = "; ".join(str(e) for e in (job.errors or [])) or status
            return DriverState(
                "failed", error=f"Pasqal Cloud job {remote_id}: {errors[:1000]}", logs=logs, started=True
            )
        return DriverState(
            "cancelled", error="Cancelled on Pasqal Cloud.", logs=logs, runtime_seconds=took, started=True
        )

    def cancel(self, device, remote_id):
        """A job that already ended cannot be cancelled (a 4xx): the poll that follows reads its
        real final state (R-JOB-2)."""
        sdk = client(device.credential_config())
        try:
            sdk.cancel_job(remote_id)
        except sdk_errors() as exc:
            error = mapped(exc, f"cancelling job {remote_id}")
            if isinstance(error, TransientDriverError):
                raise error from None
            log.info("Pasqal Cloud job %s could not be cancelled (finished?): %s", remote_id, error)
