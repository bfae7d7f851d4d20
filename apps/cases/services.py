"""State-changing operations on cases and campaigns: create, upload, launch, cancel, refresh."""

from __future__ import annotations

import logging
import shutil
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection, transaction
from django.utils import timezone

from apps.allocations.services import charge_cases, check_case_launch
from apps.backends.base import AlreadyFinished, BackendError, CredentialsRequired
from apps.backends.readiness import case_readiness
from apps.backends.registry import BACKENDS, NoBackend, backend_class, backend_name_for_kind, get_backend, kind_map
from apps.backends.remote_common import scrub_for_pool
from apps.backends.services import check_launch_options
from apps.cases import passes, workspace
from apps.cases.models import ACTIVE, IN_FLIGHT, TERMINAL, Campaign, Case, CaseEvent, CaseStatus
from apps.core import cases_root
from apps.core.exceptions import (
    Conflict,
    Forbidden,
    InsufficientStorage,
    Invalid,
    NotFound,
    ServiceError,
    TooManyRequests,
)
from apps.credentials import services as credential_services
from apps.resources.selectors import can_use_pool

logger = logging.getLogger(__name__)


class BackendUnavailable(ServiceError):
    """502: the provider could not be reached to carry out the request (the case is unchanged)."""

    status = 502
    default_detail = "The execution backend could not be reached."


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
    workspace.create_campaign_dir(campaign.id)
    if uploads:
        add_campaign_inputs(campaign, uploads)
    return campaign


def _hold_shared_inputs(campaign_id) -> None:
    """A launch holds its campaign's row in share mode until it commits: launches of the
    campaign's cases go on together, an upload to shared/ (which takes the row for update) waits
    for them or they for it. SQLite's transactions serialize anyway."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            table = connection.ops.quote_name(Campaign._meta.db_table)
            cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR SHARE", [campaign_id])  # noqa: S608 (_meta)


def add_campaign_inputs(campaign: Campaign, uploads) -> list[str]:
    """Shared inputs are added until a case of the campaign is launched (its launch requested:
    the worker may be uploading shared/ already). Written holding the campaign's row for update,
    which a launch of one of its cases waits for (``_hold_shared_inputs``), so no launch is
    recorded halfway through; cases are still created in the campaign meanwhile (no key lock)."""
    with transaction.atomic():
        Campaign.objects.select_for_update(no_key=True).filter(pk=campaign.pk).first()
        if campaign.cases.launched().exists():
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
        raise DjangoValidationError({"resource_class": ["You may not use this class's pool."]})
    # R-BACK-6: refused at creation already (400 naming the allowed values), not at launch only.
    launch_options = check_launch_options(resource_class, launch_options or {}, owner)
    case = Case(
        owner=owner,
        resource_class=resource_class,
        name=name,
        command=command,
        launch_options=launch_options,
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


def require_owner(case: Case, user, what: str) -> None:
    """SPEC §7: launching a case and uploading its inputs are the owner's alone; staff, who see
    every case, may cancel or refresh it but not act as its owner (403)."""
    if case.owner_id != user.pk:
        raise Forbidden(f"Only the case's owner may {what}.")


def add_inputs(case: Case, uploads) -> list[str]:
    """R-CASE-7: inputs are uploaded while the case is prepared (and not being launched), under
    the case's row lock, which its launch takes too: no launch is recorded halfway through."""
    with transaction.atomic():
        locked = Case.objects.select_for_update().only("status", "launch_requested_at").get(pk=case.pk)
        if locked.is_launched:
            raise Conflict("Inputs can only be added while the case is prepared.", status=locked.status)
        return workspace.save_uploads(workspace.case_dir(case.id) / "inputs", uploads)


# -- credentials (R-BACK-1) ------------------------------------------------------------------------
def scrub_for(pool, text: str) -> str:
    """Error text without the values of the pool's credentials, before it is stored or shown."""
    return scrub_for_pool(pool, text)


# -- launch (R-CASE-1) -----------------------------------------------------------------------------
def launch_case(case: Case, *, user=None, launch_options=None) -> Case:
    """R-CASE-1, the request half: validate and record the launch, nothing more. The upload and
    the submission take minutes on a remote provider (a 512 MB input, a token refresh, a retry),
    so they happen in a worker (``passes.submit_pass``, enqueued here once this commits); the
    case stays ``prepared`` with ``launch_requested_at`` set ("submitting") until the worker
    records ``pending`` or ``failed``. Idempotent: a second launch of the same case is a 409, and
    the worker adopts a job already submitted under the case's name instead of a second one.

    ``user``: the person asking (the API, the pages): the case must be theirs (403). Whoever asks,
    the pool's case backend must be set up on this host (below), else nothing is recorded."""
    if user is not None:
        require_owner(case, user, "launch it")
    if launch_options is not None and not isinstance(launch_options, dict):
        raise Invalid("launch_options must be a JSON object.", launch_options=["Must be a JSON object."])
    # R-POOL-8 at the moment the case takes the pool's capacity, not only when it was prepared: a
    # grant withdrawn since then (a user leaving the pool's group) ends the use of the pool.
    pool = case.resource_class.pool
    if not can_use_pool(case.owner, pool):
        raise Forbidden(
            f"User '{case.owner.username}' may no longer use pool '{pool.name}': ask an operator for access."
        )
    # R-CASE-8: refused up front (403 naming what to ask an operator) when the owner has no Unix
    # account this pool may run the command as; checked again when the worker builds the submission.
    passes.run_as(case)
    # Per-user credentials: refused up front (403 naming the page to connect at) while the owner has
    # no working connection to the pool; a grant revoked without our knowing fails in the worker.
    credential_services.require_connection(case.owner, pool)
    # The host's set-up (``case_readiness``: no provider call), before the launch options ask the
    # provider: 400 saying what is missing, rather than a launch recorded for a worker that could
    # only fail it. A kind with no case backend at all is refused under the lock, naming the kinds
    # that run cases.
    readiness = case_readiness(pool)
    if readiness.runs_cases and not readiness.ready:
        raise Invalid(readiness.message, resource_class=[readiness.message])
    # R-BACK-6: the options that will be submitted (these, or those stored at creation) must be
    # among what the backend declares now. Checked before the row lock: it may ask the provider.
    chosen = launch_options if launch_options is not None else case.launch_options
    launch_options = check_launch_options(case.resource_class, chosen or {}, case.owner)
    # A case needs room on the cases disk from its first second (its run directory, the output it
    # writes, its results): below GRIDGATE_CASES_MIN_FREE_MB it is not started at all.
    free = cases_root.free_bytes()
    if cases_root.low_on_space(free):
        raise InsufficientStorage(
            f"The disk that holds case workspaces is nearly full: {free / 2**20:.0f} MiB free, below the "
            f"{settings.GRIDGATE_CASES_MIN_FREE_MB} MiB a case needs to start (GRIDGATE_CASES_MIN_FREE_MB): the "
            "launch was not recorded. Try again once an operator has made room.",
            free_bytes=free,
        )
    now = timezone.now()
    # R-ALLOC-1: no core-hours left in the owner's project on this pool: 409 with what is left.
    check_case_launch(case=case, now=now)
    with transaction.atomic():
        if case.campaign_id is not None:  # lock order: the campaign, then its case
            _hold_shared_inputs(case.campaign_id)
        locked = Case.objects.select_for_update(of=("self",)).select_related("resource_class__pool").get(pk=case.pk)
        if locked.status != CaseStatus.PREPARED:
            raise Conflict(f"The case is already {locked.status}; it cannot be launched again.", status=locked.status)
        if locked.launch_requested_at is not None:
            raise Conflict("The case is being launched already.", status=locked.status)
        try:
            locked.backend = backend_name_for_kind(locked.resource_class.pool.kind)
        except NoBackend as exc:
            raise Invalid(str(exc), resource_class=[str(exc)]) from None
        locked.launch_options = launch_options
        locked.launch_requested_at = now
        locked.poll_failures = 0  # counts submission attempts while prepared
        locked.last_error = ""
        locked.save(update_fields=["backend", "launch_options", "launch_requested_at", "poll_failures", "last_error"])
        _event(
            locked,
            kind=CaseEvent.Kind.LAUNCH,
            message=f"launch requested on the {locked.backend} backend",
            options=locked.launch_options,
            at=now,
        )
        passes.enqueue_submit([locked.pk])  # sent once this commits: the worker must see the request
    return locked


# -- cancel (R-CASE-6) -----------------------------------------------------------------------------
def _already_ended(case: Case) -> Conflict:
    """R-CASE-6: a cancel of a case that ended (before the request, not through it): 409 with its
    real status."""
    return Conflict(f"The case already ended: {case.status}.", status=case.status)


def cancel_case(case: Case) -> Case:
    """Idempotent and never a 500: a prepared case is just marked cancelled; an active one is
    cancelled at the provider first; a case that ended meanwhile answers 409 with its real status."""
    now = timezone.now()
    elsewhere = False
    with transaction.atomic():
        if Case.objects.filter(pk=case.pk, status=CaseStatus.PREPARED).update(
            status=CaseStatus.CANCELLED, finished_at=now
        ):
            # Read after our update: the row lock makes a pin committed meanwhile visible here, and
            # a pin arriving later finds the case cancelled and starts nothing.
            case = Case.objects.select_related("resource_class__pool").get(pk=case.pk)
            launched = case.launch_requested_at is not None
            elsewhere = launched and case.run_host not in ("", passes.this_host())
            message = ""
            if elsewhere:
                # Pinned to another host, whose worker may have started the process and died before
                # recording it. Only that host's /proc can find it: record the request for its
                # per-host pass (passes.orphan_cancel_pass), never try it here.
                Case.objects.filter(pk=case.pk).update(cancel_requested_at=now)
                case.cancel_requested_at = now
                message = f"the worker on {case.run_host} stops any process its launch started"
            _event(
                case,
                kind=CaseEvent.Kind.CANCEL,
                from_status=CaseStatus.PREPARED,
                to_status=CaseStatus.CANCELLED,
                message=message,
            )
        else:
            launched = None
    if launched is not None:
        # A launch was requested (e.g. an uncertain submission waiting for its retry): the
        # provider may hold a job for this case. Look it up, with no transaction open, and stop
        # it so nothing runs (or bills) for a cancelled case (R-CASE-6). If that fails (a
        # provider hiccup), the request stays recorded and the orphan pass retries it.
        if launched and not elsewhere and not passes.cancel_orphan(case):
            Case.objects.filter(pk=case.pk).update(cancel_requested_at=timezone.now())
        return case
    case = Case.objects.select_related("resource_class__pool").get(pk=case.pk)
    if case.status in TERMINAL:
        raise _already_ended(case)
    if case.run_host and case.run_host != passes.this_host():
        return _request_cancel_on_run_host(case)
    try:
        get_backend(case.backend).cancel(passes.job_ref(case))  # no transaction open
    except AlreadyFinished:
        # The provider finished it between our last poll and this request. R-CASE-6: answer with
        # its real final state, asked with one status call (like the cancel call itself; no pass,
        # no download: R-CASE-2). Recording it, and fetching results before "done" (R-CASE-4),
        # is the worker's job: poll it now.
        Case.objects.filter(pk=case.pk, status__in=list(ACTIVE)).update(next_poll_at=timezone.now())
        passes.enqueue_poll([case.id])
        case.refresh_from_db()
        if case.status in TERMINAL:
            raise _already_ended(case) from None
        final = _provider_final_status(case)
        raise Conflict(
            f"The case already ended on the provider's side ({final or 'final state unknown'}); "
            "its results are being brought back.",
            status=final or case.status,
            recorded_status=case.status,
        ) from None
    except CredentialsRequired as exc:
        # Only the owner's own credential may act on their job at the provider (R-CRED-1).
        raise Conflict(f"The case cannot be cancelled until its owner reconnects: {exc}.", status=case.status) from None
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
            # R-ALLOC-1: the run time it had used by its last poll, charged once with its end.
            charge_cases(cases=[case], now=timezone.now())
    case.refresh_from_db()
    if not updated:
        if case.status == CaseStatus.CANCELLED:
            # Stopped by this very cancel: a command that traps SIGTERM ends only after the grace
            # period, and the worker's poll, which runs meanwhile, saw the stop and recorded it
            # first. The cancel did what was asked (a case cancelled before it was asked is the
            # 409 above).
            return case
        raise _already_ended(case)
    return case


def _request_cancel_on_run_host(case: Case) -> Case:
    """A local case's process runs on another host (``run_host``), whose /proc alone can stop it.
    Record the request and make the case due: that host's next poll cancels the process and records
    "cancelled" (within GRIDGATE_CASE_TICK_INTERVAL). Idempotent: a repeat keeps the first
    request's time."""
    now = timezone.now()
    with transaction.atomic():
        asked = Case.objects.filter(pk=case.pk, status__in=list(ACTIVE), cancel_requested_at__isnull=True).update(
            cancel_requested_at=now, next_poll_at=now
        )
        if asked:
            message = f"cancel requested; the worker on {case.run_host} stops it"
            _event(case, kind=CaseEvent.Kind.CANCEL, message=message)
        passes.enqueue_poll([case.pk])
    case.refresh_from_db()
    if not asked and case.status in TERMINAL:  # it ended before the request (not through it)
        raise _already_ended(case)
    return case


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
        wait = max(1, int((last + minimum - now).total_seconds()) + 1)
        raise TooManyRequests(f"This case was refreshed moments ago: retry in {wait} s.", retry_after=wait)
    # R-CASE-2: passes never run in request handling. The case is made due now and a worker
    # polls (and syncs) it within the broker's poll interval; the answer is the current state.
    Case.objects.filter(pk=case.pk, status__in=list(ACTIVE)).exclude(remote_id="").update(
        next_poll_at=now, next_sync_at=now
    )
    case.refresh_from_db()
    if case.status in ACTIVE and case.remote_id:
        passes.enqueue_refresh([case.id])
    return case


def check_unix_uid_change(user) -> None:
    """R-CASE-8: a user's linked Unix uid is not changed nor unlinked while their cases run under
    it (in flight on a pool that runs each case as its owner's account). Their processes and
    files keep the old uid: the service would act on them as another account, and the old uid,
    freed, could be linked to another user, whose cases would then share an account with them.
    Raises :class:`Conflict` saying how many run under it."""
    kinds = [kind for kind, name in kind_map().items() if name in BACKENDS and backend_class(name).runs_as_user]
    running = Case.objects.filter(
        IN_FLIGHT, owner=user, resource_class__pool__kind__in=kinds, resource_class__pool__trusted=False
    ).count()
    if running:
        raise Conflict(
            f"{running} case(s) of {user} run under this uid: change or unlink it once they have ended "
            "(or cancel them)."
        )


def deletable(cases):
    """The rows of ``cases`` that may be deleted (the admin): finished cases, and prepared ones
    whose launch was not asked for. An unfinished case's row is what polls, cancels and charges
    its remote job; deleting it would leave that job running at the provider. Cancel it first."""
    return cases.exclude(IN_FLIGHT)


def delete_cases(cases) -> int:
    """Delete the deletable ``cases`` (under their row locks: a launch asked for meanwhile keeps
    its case) and, once committed, their workspaces, which nothing else could reach or clean."""
    with transaction.atomic():
        ids = list(deletable(cases).select_for_update().values_list("pk", flat=True))
        Case.objects.filter(pk__in=ids).delete()
        roots = [workspace.case_dir(pk) for pk in ids]
        transaction.on_commit(lambda: [shutil.rmtree(root, ignore_errors=True) for root in roots])
    return len(ids)


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
