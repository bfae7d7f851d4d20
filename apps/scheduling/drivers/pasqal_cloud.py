"""The ``pasqal_cloud`` driver: Pasqal Cloud (remote QPUs and cloud emulators) through the
``pasqal-cloud`` SDK.

A Gridgate job becomes one closed batch with one job of ``shots`` runs on the configured device
type; polls read that job, its counts come from the job's results; cancel cancels the job.

Device ``config``:
- ``project_id``: the Pasqal Cloud project the batches are billed to;
- ``device_type``: a Pasqal Cloud device type (``FRESNEL``, ``EMU_MPS``, ``EMU_FREE``, …);
- credentials, from the environment only: ``username_env`` and ``password_env`` (the names of
  the variables holding them), or ``token_env`` (a ready bearer token);
- ``pulser_device``: for a cloud emulator whose specs Pasqal Cloud does not publish, the Pulser
  device sequences must be built for (default: the specs Pasqal Cloud gives for the device type);
- ``endpoint``, ``account_endpoint``, ``token_endpoint``: other API and authentication URLs
  (another region, or a test double); Pasqal Cloud's own by default.

SDK errors map to the scheduler's: a 5xx, 408, 429, a lost connection or a failed token request
is transient (the job goes back to the queue, R-JOB-3); another 4xx is permanent. The SDK's own
exceptions derive from ``BaseException``, hence the explicit list below.

Lost answers: each batch carries the tag ``gridgate-job-<id>`` and the intent is recorded before
``create_batch``; a later attempt whose first answer was lost looks the batch up by that tag
and adopts it instead of creating a second one.
"""

import json
import logging
import warnings
from datetime import datetime

from apps.core import credentials
from apps.core.exceptions import Unavailable
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
from apps.scheduling.models import DriverRun

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

    response = getattr(exc, "response", None) or getattr(exc.__cause__, "response", None)
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
            return credentials.read(config.get(key), f"Pasqal Cloud {key[:-4]}")
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
        for key in ("endpoint", "account_endpoint", "token_endpoint"):
            value = config.get(key)
            if value is not None and (not isinstance(value, str) or not value.startswith(("https://", "http://"))):
                problems.append(f"'{key}' must be an http(s) URL")
        return problems

    # -- specs and status ------------------------------------------------------------------
    def pulser_device(self, device):
        config = device.config or {}
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

    def validate_payload(self, device, payload, shots):
        """R-DEV-1 against the device type's specs as Pasqal Cloud publishes them."""
        validate_sequence(payload, shots, self.pulser_device(device), where=f"device '{device.name}'")

    def check_status(self, device):
        """Up while Pasqal Cloud offers the device type to the project (its specs are listed);
        cloud emulators without published specs are up while the API answers."""
        config = device.config or {}
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
        return ProviderStatus("up", message=f"{config['device_type']} offered by Pasqal Cloud", specs=parsed)

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, device, job):
        from pasqal_cloud.device import DeviceTypeName
        from pasqal_cloud.utils.filters import BatchFilters

        config = device.config or {}
        tag = run_tag(job)
        run, created = DriverRun.objects.get_or_create(
            remote_id=tag, defaults={"device": device, "payload": job.payload, "shots": job.shots, "status": "prepared"}
        )
        if run.external_id:
            return run.external_id
        sdk = client(config)
        sequence = job.payload["sequence"]
        try:
            if run.status == "submitting":  # an earlier create_batch left and its answer was lost
                found = sdk.get_batches(filters=BatchFilters(tag=tag)).results
                if found:
                    log.warning("lost submission %s found on Pasqal Cloud as batch %s: adopted", tag, found[0].id)
                    return self._record(run, found[0].ordered_jobs[0].id)
            DriverRun.objects.filter(pk=tag).update(status="submitting")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                batch = sdk.create_batch(
                    sequence if isinstance(sequence, str) else json.dumps(sequence),
                    jobs=[{"runs": job.shots}],
                    device_type=DeviceTypeName(config["device_type"]),
                    tags=[tag],
                )
        except sdk_errors() as exc:
            raise mapped(exc, "submitting the batch") from None
        return self._record(run, batch.ordered_jobs[0].id)

    def _record(self, run, job_id: str) -> str:
        DriverRun.objects.filter(pk=run.pk).update(external_id=str(job_id), status="submitted")
        return str(job_id)

    def poll(self, device, remote_id):
        sdk = client(device.config or {})
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
        sdk = client(device.config or {})
        try:
            sdk.cancel_job(remote_id)
        except sdk_errors() as exc:
            error = mapped(exc, f"cancelling job {remote_id}")
            if isinstance(error, TransientDriverError):
                raise error from None
            log.info("Pasqal Cloud job %s could not be cancelled (finished?): %s", remote_id, error)
