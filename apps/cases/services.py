"""State-changing operations on cases and campaigns: create, upload, launch, cancel, refresh."""

from __future__ import annotations

import logging
import shutil
import threading
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework import status as http_status
from rest_framework.exceptions import APIException, NotFound, Throttled
from rest_framework.exceptions import ValidationError as DRFValidationError

from apps.backends.base import AlreadyFinished, BackendError, JobRef, LeaseLost, SubmitSpec, SubmitUncertain
from apps.backends.registry import NoBackend, backend_name_for_kind, get_backend
from apps.backends.remote_common import scrub_for_pool
from apps.cases import passes, workspace
from apps.cases.models import ACTIVE, TERMINAL, Campaign, Case, CaseEvent, CaseStatus
from apps.core.api.exceptions import Conflict
from apps.core.exceptions import ServiceError
from apps.resources.launch import launch_spec
from apps.resources.selectors import can_use_pool, run_as_for

logger = logging.getLogger(__name__)

#: launches retried after an uncertain submission (timeout) before the case is failed
MAX_UNCERTAIN_SUBMITS = 5


class BackendUnavailable(APIException):
    """The provider could not be reached to carry out the request (the case is unchanged)."""

    status_code = http_status.HTTP_502_BAD_GATEWAY
    default_detail = "The execution backend could not be reached."
    default_code = "backend_unavailable"


def _event(case, *, kind=CaseEvent.Kind.TRANSITION, from_status="", to_status="", message="", options=None, at=None):
    return CaseEvent.objects.create(
        case=case,
        at=at or timezone.now(),
        kind=kind,
        from_status=from_status,
        to_status=to_status,
        message=message[:2000],
        options=options,
    )


# -- creation and inputs ---------------------------------------------------------------------------
def create_campaign(*, owner, name: str, uploads=()) -> Campaign:
    campaign = Campaign(owner=owner, name=name)
    campaign.full_clean()
    campaign.save()
    workspace.campaign_shared_dir(campaign.id).mkdir(parents=True, exist_ok=True)
    if uploads:
        add_campaign_inputs(campaign, uploads)
    return campaign


def add_campaign_inputs(campaign: Campaign, uploads) -> list[str]:
    if campaign.cases.exclude(status=CaseStatus.PREPARED).exists():
        # A launched case may be reading shared/ right now (or a backend uploaded it once).
        raise Conflict("Shared inputs are frozen once a case of the campaign has been launched.")
    return workspace.save_uploads(workspace.campaign_shared_dir(campaign.id), uploads)


def create_case(
    *,
    owner,
    resource_class,
    name: str,
    command: str,
    launch_options=None,
    observability_globs=None,
    campaign: Campaign | None = None,
    uploads=(),
) -> Case:
    """A prepared case with its workspace (and its input files, all or nothing)."""
    if not can_use_pool(owner, resource_class.pool):
        raise DRFValidationError({"resource_class": ["You may not use this class's pool."]})
    case = Case(
        owner=owner,
        resource_class=resource_class,
        name=name,
        command=command,
        launch_options=launch_options or {},
        observability_globs=observability_globs or [],
        campaign=campaign,
    )
    case.full_clean()
    try:
        case.backend = backend_name_for_kind(resource_class.pool.kind)
    except NoBackend:
        case.backend = ""  # launching will say clearly why it cannot run
    root = workspace.create_case_dir(case.id)
    try:
        workspace.save_uploads(root / "inputs", uploads)
        with transaction.atomic():
            case.save(force_insert=True)
            _event(case, to_status=CaseStatus.PREPARED, message="created")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return case


def add_inputs(case: Case, uploads) -> list[str]:
    """R-CASE-7: inputs are uploaded while the case is prepared (and not being launched)."""
    case.refresh_from_db(fields=["status", "launch_requested_at"])
    if case.status != CaseStatus.PREPARED or case.launch_requested_at is not None:
        raise Conflict("Inputs can only be added while the case is prepared.", status=case.status)
    return workspace.save_uploads(workspace.case_dir(case.id) / "inputs", uploads)


# -- credentials (R-BACK-1) ------------------------------------------------------------------------
def scrub_for(pool, text: str) -> str:
    """Error text without the values of the pool's credentials, before it is stored or shown."""
    return scrub_for_pool(pool, text)


# -- launch (R-CASE-1) -----------------------------------------------------------------------------
class LaunchLease:
    """Renews a launch lease while its holder submits (uploads can outlast the lease): without it
    the submit pass of another worker takes an expired lease over and submits a second job.
    Each renewal is one UPDATE (backends call it between upload steps, which take far longer);
    only the submitting thread renews (a transfer thread has no business with the database)."""

    def __init__(self, case_id, owner: str):
        self.case_id = case_id
        self.owner = owner
        self.thread = threading.get_ident()

    def renew(self) -> None:
        if threading.get_ident() != self.thread:
            return
        now = timezone.now()
        held = Case.objects.filter(pk=self.case_id, lease_owner=self.owner, status=CaseStatus.PREPARED).update(
            lease_until=now + timedelta(seconds=passes.lease_seconds())
        )
        if not held:
            raise LeaseLost("the launch was taken over or cancelled meanwhile; this attempt stops here")


def run_as(case: Case):
    """R-CASE-8: the account the case's command runs as, for backends that run it on this site's
    accounts (local, Slurm); None for the others. Raises Forbidden/Unavailable (see
    :func:`apps.resources.selectors.run_as_for`)."""
    try:
        backend = get_backend(case.backend or backend_name_for_kind(case.resource_class.pool.kind))
    except NoBackend:
        return None
    if not backend.runs_as_user:
        return None
    return run_as_for(case.owner, case.resource_class.pool)


def build_spec(case: Case) -> SubmitSpec:
    resource_class = case.resource_class
    spec = launch_spec(resource_class)
    return SubmitSpec(
        case_id=str(case.id),
        command=case.command,
        workspace=workspace.case_dir(case.id),
        pool_remote=resource_class.pool.remote_config(),
        resources=spec["resources"],
        batch_directives=spec["batch_directives"],
        environment=spec["environment"],
        launch_options=dict(case.launch_options or {}),
        observability_globs=list(case.observability_globs or []),
        shared_dir=workspace.campaign_shared_dir(case.campaign_id) if case.campaign_id else None,
        run_as=run_as(case),
    )


def launch_case(case: Case, *, launch_options=None) -> Case:
    """R-CASE-1: record the launch request under a lease, submit with no transaction open, record
    the outcome in a short transaction. Idempotent: the backend adopts a job already submitted
    under the case's name instead of creating a second one."""
    if launch_options is not None and not isinstance(launch_options, dict):
        raise DRFValidationError({"launch_options": ["Must be a JSON object."]})
    # R-CASE-8: refused up front (403 naming what to ask an operator) when the owner has no Unix
    # account this pool may run the command as; checked again when the submission is built.
    run_as(case)
    now = timezone.now()
    owner = passes.worker_id()
    with transaction.atomic():
        locked = Case.objects.select_for_update().select_related("resource_class__pool").get(pk=case.pk)
        if locked.status != CaseStatus.PREPARED:
            raise Conflict(f"The case is already {locked.status}; it cannot be launched again.", status=locked.status)
        if locked.lease_until is not None and locked.lease_until > now:
            raise Conflict("The case is being launched right now.", status=locked.status)
        try:
            locked.backend = backend_name_for_kind(locked.resource_class.pool.kind)
        except NoBackend as exc:
            raise DRFValidationError({"resource_class": [str(exc)]}) from None
        if launch_options is not None:
            locked.launch_options = launch_options
        locked.launch_requested_at = now
        locked.lease_owner = owner
        locked.lease_until = now + timedelta(seconds=passes.lease_seconds())
        locked.save(update_fields=["backend", "launch_options", "launch_requested_at", "lease_owner", "lease_until"])
        _event(
            locked,
            kind=CaseEvent.Kind.LAUNCH,
            message=f"launch requested on the {locked.backend} backend",
            options=locked.launch_options,
            at=now,
        )
    submit_claimed(locked, owner=owner)
    locked.refresh_from_db()
    return locked


def submit_claimed(case: Case, *, owner: str) -> bool:
    """Submit a case whose launch lease ``owner`` holds; returns True if the outcome was recorded.

    The lease is renewed first (a case late in a submit pass's batch may have waited out its
    lease) and while the backend prepares the submission (``spec.keepalive``); a lease lost
    meanwhile stops the attempt before anything is submitted (R-CASE-1)."""
    lease = LaunchLease(case.pk, owner)
    try:
        lease.renew()
    except LeaseLost:
        logger.info("case %s: launch lease lost before submitting; left to its new holder", case.id)
        return False
    pool = case.resource_class.pool
    remote_id, error, uncertain = None, "", False
    spec = None
    try:
        spec = build_spec(case)
        spec.keepalive = lease.renew
        backend = get_backend(case.backend)
        # Look the job up by name first: a retried launch adopts it (R-CASE-1).
        remote_id = backend.find(spec)
        if not remote_id:
            spec.heartbeat()
            remote_id = backend.submit(spec)
    except LeaseLost:
        logger.info("case %s: launch lease lost while submitting; nothing was submitted", case.id)
        return False
    except ServiceError as exc:  # no account to run as (R-CASE-8): the case fails saying why
        error = exc.detail
    except SubmitUncertain as exc:
        error, uncertain = scrub_for(pool, str(exc)), True
    except BackendError as exc:
        error = scrub_for(pool, str(exc))
    except Exception as exc:  # an SDK's own exception type: still a failed submission, never stuck
        error = scrub_for(pool, f"{type(exc).__name__}: {exc}")
        logger.error("case %s: submission raised %s", case.id, error)
    now = timezone.now()
    if uncertain and case.poll_failures + 1 < MAX_UNCERTAIN_SUBMITS:
        return _retry_uncertain_submit(case, owner=owner, error=error, now=now)
    with transaction.atomic():
        fields = {"lease_owner": "", "lease_until": None}
        if remote_id:
            fields.update(
                status=CaseStatus.PENDING,
                remote_id=str(remote_id),
                submitted_at=now,
                next_poll_at=now,
                poll_failures=0,
                last_error="",
            )
        else:
            fields.update(status=CaseStatus.FAILED, last_error=error[:2000], finished_at=now)
        updated = Case.objects.filter(pk=case.pk, lease_owner=owner, status=CaseStatus.PREPARED).update(**fields)
        if updated:
            _event(
                case,
                from_status=CaseStatus.PREPARED,
                to_status=fields["status"],
                message=f"submitted as {remote_id}" if remote_id else f"submission failed: {error}",
                at=now,
            )
    if updated and uncertain:
        # The last uncertain attempt failed the case, yet the provider may have created the job
        # late: look once more and cancel it rather than leave it running unrecorded (R-CASE-1).
        _cancel_orphan(case)
    if not updated:
        current = Case.objects.filter(pk=case.pk).values_list("status", flat=True).first()
        if remote_id and current == CaseStatus.CANCELLED:
            # Cancelled while the submission was in flight: do not leave an orphan job running.
            try:
                backend.cancel(JobRef(str(case.id), str(remote_id), spec.workspace, spec.pool_remote))
            except Exception as exc:
                logger.warning("case %s: orphan job %s not cancelled: %s", case.id, remote_id, exc)
        return False
    if remote_id:
        from apps.cases.tasks import enqueue_poll

        enqueue_poll([case.id])
    return True


def _retry_uncertain_submit(case: Case, *, owner: str, error: str, now) -> bool:
    """The provider may hold a job for this case: stay prepared, keep the launch request, and let
    the submit pass retry once the back-off lease expires. The retry calls ``find`` first, so a
    job that did reach the provider is adopted, never submitted twice (R-CASE-1). The attempt
    count lives in ``poll_failures`` (unused while prepared); the last attempt fails the case."""
    attempts = case.poll_failures + 1
    with transaction.atomic():
        updated = Case.objects.filter(pk=case.pk, lease_owner=owner, status=CaseStatus.PREPARED).update(
            poll_failures=attempts,
            last_error=f"submission uncertain (attempt {attempts}): {error}"[:2000],
            lease_owner="submit-retry",
            lease_until=now + passes.backoff(attempts),
        )
        if updated:
            _event(case, kind=CaseEvent.Kind.ERROR, message=f"submission uncertain, will retry: {error}", at=now)
    return bool(updated)


# -- cancel (R-CASE-6) -----------------------------------------------------------------------------
def cancel_case(case: Case) -> Case:
    """Idempotent and never a 500: a prepared case is just marked cancelled; an active one is
    cancelled at the provider first; a case that ended meanwhile answers 409 with its real status."""
    now = timezone.now()
    with transaction.atomic():
        if Case.objects.filter(pk=case.pk, status=CaseStatus.PREPARED).update(
            status=CaseStatus.CANCELLED, finished_at=now
        ):
            _event(case, kind=CaseEvent.Kind.CANCEL, from_status=CaseStatus.PREPARED, to_status=CaseStatus.CANCELLED)
            case = Case.objects.select_related("resource_class__pool").get(pk=case.pk)
            launched = case.launch_requested_at is not None
        else:
            launched = None
    if launched is not None:
        if launched:
            # A launch was requested (e.g. an uncertain submission waiting for its retry): the
            # provider may hold a job for this case. Look it up, with no transaction open, and
            # stop it so nothing runs (or bills) for a cancelled case (R-CASE-6).
            _cancel_orphan(case)
        return case
    case = Case.objects.select_related("resource_class__pool").get(pk=case.pk)
    if case.status in TERMINAL:
        raise Conflict(f"The case already ended: {case.status}.", status=case.status)
    try:
        get_backend(case.backend).cancel(passes.job_ref(case))  # no transaction open
    except AlreadyFinished:
        # The provider finished it between our last poll and this request. R-CASE-6: answer with
        # its real final state, asked with one status call (like the cancel call itself; no pass,
        # no download: R-CASE-2). Recording it, and fetching results before "done" (R-CASE-4),
        # is the worker's job: poll it now.
        from apps.cases.tasks import enqueue_poll

        Case.objects.filter(pk=case.pk, status__in=list(ACTIVE)).update(next_poll_at=timezone.now())
        enqueue_poll([case.id])
        case.refresh_from_db()
        if case.status in TERMINAL:
            raise Conflict(f"The case already ended: {case.status}.", status=case.status) from None
        final = _provider_final_status(case)
        raise Conflict(
            f"The case already ended on the provider's side ({final or 'final state unknown'}); "
            "its results are being brought back.",
            status=final or case.status,
            recorded_status=case.status,
        ) from None
    except BackendError as exc:
        text = scrub_for(case.resource_class.pool, str(exc))
        Case.objects.filter(pk=case.pk).update(last_error=f"cancel failed: {text}"[:2000])
        raise BackendUnavailable(f"The backend could not cancel the case: {text}") from None
    with transaction.atomic():
        previous = case.status
        updated = Case.objects.filter(pk=case.pk, status__in=list(ACTIVE), remote_id=case.remote_id).update(
            status=CaseStatus.CANCELLED, finished_at=timezone.now()
        )
        if updated:
            _event(case, kind=CaseEvent.Kind.CANCEL, from_status=previous, to_status=CaseStatus.CANCELLED)
    case.refresh_from_db()
    if not updated:
        raise Conflict(f"The case already ended: {case.status}.", status=case.status)
    return case


def _cancel_orphan(case: Case) -> None:
    try:
        backend = get_backend(case.backend)
        spec = build_spec(case)
        remote_id = backend.find(spec)
        if remote_id:
            backend.cancel(JobRef(str(case.id), str(remote_id), spec.workspace, spec.pool_remote))
            logger.info("case %s: cancelled the job %s its uncertain submission left", case.id, remote_id)
    except AlreadyFinished:
        pass
    except Exception as exc:
        logger.warning(
            "case %s: a job left by its launch may still run: %s",
            case.id,
            scrub_for(case.resource_class.pool, f"{type(exc).__name__}: {exc}"),
        )


_FINAL = {"succeeded": CaseStatus.DONE, "failed": CaseStatus.FAILED, "cancelled": CaseStatus.CANCELLED}


def _provider_final_status(case: Case) -> str | None:
    """How the provider says the case ended (done/failed/cancelled), or None if it cannot tell."""
    try:
        state = get_backend(case.backend).poll(passes.job_ref(case))
    except Exception as exc:  # a failed status call only makes the answer less precise
        logger.info("case %s: final state unknown: %s", case.id, scrub_for(case.resource_class.pool, str(exc)))
        return None
    return _FINAL.get(state.status)


# -- refresh (R-CASE-2: an immediate, throttled pull of one case) ----------------------------------
def refresh_case(case: Case) -> Case:
    now = timezone.now()
    minimum = timedelta(seconds=settings.GRIDGATE_CASE_REFRESH_SECONDS)
    # Compare-and-set on last_refresh_at: concurrent refreshes of one case cost one provider call.
    window_open = Case.objects.filter(pk=case.pk).exclude(last_refresh_at__gt=now - minimum)
    if not window_open.update(last_refresh_at=now):
        last = Case.objects.filter(pk=case.pk).values_list("last_refresh_at", flat=True).first()
        if last is None:
            raise NotFound()
        raise Throttled(wait=max(1, int((last + minimum - now).total_seconds()) + 1))
    # R-CASE-2: passes never run in request handling. The case is made due now and a worker
    # polls (and syncs) it within the broker's poll interval; the answer is the current state.
    Case.objects.filter(pk=case.pk, status__in=list(ACTIVE)).exclude(remote_id="").update(
        next_poll_at=now, next_sync_at=now
    )
    case.refresh_from_db()
    if case.status in ACTIVE and case.remote_id:
        from apps.cases.tasks import enqueue_refresh

        enqueue_refresh([case.id])
    return case


def delete_campaign(campaign: Campaign) -> None:
    """Refused while the campaign has unfinished cases (their workspaces read shared/). The count
    and the deletion happen under the campaign's row lock, so a case created in the campaign
    meanwhile (its insert waits on the lock) is never orphaned."""
    with transaction.atomic():
        Campaign.objects.select_for_update().filter(pk=campaign.pk).first()
        unfinished = campaign.cases.exclude(status__in=list(TERMINAL)).count()
        if unfinished:
            raise Conflict(f"The campaign still has {unfinished} unfinished case(s).")
        campaign.cases.update(campaign=None)  # finished cases stay, with their own workspaces
        campaign.delete()
    shutil.rmtree(workspace.campaign_shared_dir(campaign.id).parent, ignore_errors=True)
