"""Worker passes over cases: submit (recovery), poll, sync, and the finalize step (R-CASE-2 … 5).

Every pass follows claim–commit–call–record:

1. **claim** a batch in a short transaction with ``select_for_update(skip_locked=True)`` and a
   lease (``lease_owner``, ``lease_until``), so any number of workers on any number of hosts share
   the work; a killed worker's lease expires and another worker resumes its cases;
2. talk to the backend with **no transaction or lock held**;
3. **record** the outcomes in a new short transaction, only for the cases whose lease and
   ``remote_id`` are still ours and whose status did not change meanwhile (a cancel, a relaunch).

Reads and writes are bulk (one claim, one load, one locked re-read, one ``bulk_update``, one
``bulk_create`` of events), so a pass's query count does not grow with the number of cases.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.allocations import services as charges
from apps.backends import files
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    CredentialsRequired,
    JobRef,
    LeaseLost,
    ResultsTooLarge,
    SubmitSpec,
    SubmitUncertain,
)
from apps.backends.registry import NoBackend, backend_name_for_kind, get_backend
from apps.backends.remote_common import scrub_for_pool
from apps.cases import workspace
from apps.cases.models import ACTIVE, TERMINAL, Case, CaseEvent, CaseStatus
from apps.core import cases_root, leases
from apps.core.exceptions import ServiceError
from apps.core.rows import bulk_write
from apps.core.tasks import enqueue
from apps.credentials import services as credential_services
from apps.notifications import services as notifications
from apps.notifications.models import Event
from apps.resources.launch import case_bounds, launch_spec
from apps.resources.selectors import run_as_for

logger = logging.getLogger(__name__)

POLL_FIELDS = [
    "status",
    "progress",
    "execution_time",
    "cores",
    "started_at",
    "finished_at",
    "last_polled_at",
    "poll_failures",
    "last_error",
    "log_gap",
    "status_message",
    "results_fetched",
    "next_poll_at",
    "next_sync_at",
    "lease_owner",
    "lease_until",
]
SYNC_FIELDS = ["progress", "last_synced_at", "next_sync_at", "last_error", "lease_owner", "lease_until"]


def worker_id() -> str:
    """Unique per pass: host, process, thread and a nonce (two passes never share a lease)."""
    return f"{settings.GRIDGATE_WORKER_HOST[:40]}:{os.getpid()}:{threading.get_ident() % 100000}:{uuid.uuid4().hex[:8]}"


def this_host() -> str:
    """The worker host identity cases are pinned to (``Case.run_host``)."""
    return settings.GRIDGATE_WORKER_HOST[: Case._meta.get_field("run_host").max_length]


def lease_seconds() -> int:
    return settings.GRIDGATE_CASE_LEASE_SECONDS


def backoff(failures: int) -> timedelta:
    """R-CASE-3: exponential back-off after failed polls, capped."""
    base = settings.GRIDGATE_CASE_POLL_SECONDS
    return timedelta(seconds=min(base * (2 ** min(failures, 20)), settings.GRIDGATE_CASE_MAX_BACKOFF_SECONDS))


def job_ref(case: Case) -> JobRef:
    return JobRef(
        case_id=str(case.id),
        remote_id=case.remote_id,
        workspace=workspace.case_dir(case.id),
        pool_remote=case.resource_class.pool.remote_config(),
        max_result_bytes=case_bounds(case.resource_class).disk_bytes,
        identity=remote_identity(case),
    )


_UNRESOLVED = object()


def remote_identity(case: Case):
    """Whose provider credential the case's remote calls use: its owner's own on a per-user pool,
    else the pool's service account (None for backends without one). Resolved once per case
    object; a pass resolves all its cases at once (:func:`attach_identities`)."""
    identity = case.__dict__.get("_remote_identity", _UNRESOLVED)
    if identity is _UNRESOLVED:
        identity = credential_services.identities_for([case])[case.id]
        case._remote_identity = identity
    return identity


def attach_identities(cases: list[Case]) -> None:
    """One query for the connections of every per-user case of a pass (none when there is none)."""
    identities = credential_services.identities_for(cases)
    for case in cases:
        case._remote_identity = identities[case.id]


# -- requests for a worker -------------------------------------------------------------------------
# Each names its task by dotted path (apps.cases.tasks imports this module, never the reverse),
# sent once the transaction commits: the worker must see the rows that caused it.
def enqueue_submit(case_ids) -> None:
    """Submit these cases soon, in a worker: the upload and the provider call never run in the
    request that launched them (R-CASE-1)."""
    enqueue("apps.cases.tasks.submit_cases", [str(case_id) for case_id in case_ids])


def enqueue_poll(case_ids) -> None:
    """Poll these cases soon, in a worker (never in the request: R-CASE-2)."""
    enqueue("apps.cases.tasks.poll_cases", [str(case_id) for case_id in case_ids])


def enqueue_refresh(case_ids) -> None:
    """A user asked to refresh these cases: poll and sync them soon, in a worker (R-CASE-2)."""
    enqueue("apps.cases.tasks.refresh_cases", [str(case_id) for case_id in case_ids])


@dataclass
class PassReport:
    claimed: int = 0
    recorded: int = 0
    skipped: int = 0
    transitions: list[tuple[str, str, str]] = field(default_factory=list)

    def __str__(self):
        return f"claimed {self.claimed}, recorded {self.recorded}, skipped {self.skipped}"


# -- claim -----------------------------------------------------------------------------------------
def claim(kind: str, *, now: datetime, owner: str, batch: int, case_ids=None, host_only: bool = False) -> list:
    """Lease up to ``batch`` due cases to ``owner``; returns their ids (R-CASE-2).

    Host affinity: a case pinned to a worker host (``run_host``: a local process) is claimed only
    on that host, whose /proc alone tells whether it runs; another host would find no process and
    fail it. ``host_only`` claims only this host's pinned cases (the per-host loop).
    """
    host = this_host()
    queryset = Case.objects.filter(Q(run_host=host) if host_only else Q(run_host="") | Q(run_host=host))
    if kind == "poll":
        queryset = queryset.filter(status__in=list(ACTIVE)).exclude(remote_id="")
        if case_ids is None:
            queryset = queryset.filter(next_poll_at__lte=now)
        queryset = queryset.order_by("next_poll_at", "id")
    elif kind == "sync":
        queryset = queryset.filter(status=CaseStatus.RUNNING)
        if case_ids is None:
            queryset = queryset.filter(next_sync_at__lte=now)
        queryset = queryset.order_by("next_sync_at", "id")
    elif kind == "submit":
        queryset = queryset.filter(status=CaseStatus.PREPARED, launch_requested_at__isnull=False).order_by(
            "launch_requested_at", "id"
        )
    elif kind == "orphan":
        # Cancelled while its launch was in flight, from another host than the one it is pinned
        # to: only the run host can find and stop a process the launch may have started.
        queryset = queryset.filter(
            status=CaseStatus.CANCELLED, cancel_requested_at__isnull=False, remote_id=""
        ).order_by("cancel_requested_at", "id")
    else:  # pragma: no cover - programming error
        raise ValueError(kind)
    if case_ids is not None:
        queryset = queryset.filter(id__in=list(case_ids))
    return leases.claim(queryset, owner=owner, now=now, lease=timedelta(seconds=lease_seconds()), batch=batch)


class Leases:
    """The leases a pass holds, renewed while it works: between cases of a long batch, and by a
    heartbeat thread (:meth:`kept_alive`) during one long provider call (a big ``fetch_final``,
    a slow sync). A lease that expired mid-pass lets another worker take the case and do the
    same work twice (two appends of one log delta, two downloads). Renewal between cases is
    throttled to a quarter of the lease; :attr:`held` is what is still ours."""

    def __init__(self, ids, owner: str, now: datetime):
        self.owner = owner
        self.now = now
        self.started = self.renewed = time.monotonic()
        self.held = set(ids)
        self._lock = threading.Lock()  # the heartbeat thread and the pass renew the same rows

    def renew(self, *, force: bool = False) -> set:
        with self._lock:
            clock = time.monotonic()
            if not self.held or (not force and clock - self.renewed < lease_seconds() / 4):
                return set(self.held)
            until = self.now + timedelta(seconds=clock - self.started + lease_seconds())
            with transaction.atomic():
                held = Case.objects.filter(id__in=list(self.held))
                leases.renew(held, owner=self.owner, until=until)
                self.held = set(held.filter(lease_owner=self.owner).values_list("id", flat=True))
            self.renewed = clock
            return set(self.held)

    def kept_alive(self) -> leases.Heartbeat:
        """Renew every quarter of the lease from a heart-beat thread while the block runs (R-CASE-2:
        one download can outlast the whole lease; past it a second worker would take the case)."""
        return leases.Heartbeat(
            lambda: self.renew(force=True),
            every=lambda: lease_seconds() / 4,
            name=f"lease-heartbeat-{self.owner}",
            what=f"lease heartbeat of {self.owner}",
        )


def _load(ids, owner) -> list[Case]:
    cases = list(Case.objects.filter(id__in=ids, lease_owner=owner).select_related("resource_class__pool", "owner"))
    attach_identities(cases)
    return cases


def _claim_and_load(kind: str, report, *, now: datetime, owner: str, batch: int, case_ids=None, host_only=False):
    """Claim up to ``batch`` due cases of ``kind`` for ``owner`` (counted in ``report``) and load
    the ones still ours: the claimed ids and the loaded cases."""
    ids = claim(kind, now=now, owner=owner, batch=batch, case_ids=case_ids, host_only=host_only)
    report.claimed = len(ids)
    return ids, (_load(ids, owner) if ids else [])


def _record(cases: list[Case], original: dict, owner: str, fields: list[str], events: list[CaseEvent], report):
    """Write back what is still ours, in one short transaction with a constant number of queries."""
    if not cases:
        return
    ids = [case.id for case in cases]
    with transaction.atomic():
        current = {
            row[0]: (row[1], row[2])
            for row in Case.objects.select_for_update()
            .filter(id__in=ids, lease_owner=owner)
            .values_list("id", "status", "remote_id")
        }
        keep, release = [], []
        for case in cases:
            now_status, now_remote = current.get(case.id, (None, None))
            if now_status is None:
                report.skipped += 1  # our lease expired and someone else took the case
                continue
            if (now_status, now_remote) != original[case.id]:
                release.append(case.id)  # cancelled or relaunched meanwhile: its new state wins
                report.skipped += 1
                continue
            case.lease_owner, case.lease_until = "", None
            keep.append(case)
        if keep:
            bulk_write(keep, fields)
            # R-ALLOC-1: a case that ended in this pass is charged cores × run time, once (the
            # ledger's unique case), in the transaction that records its end.
            ended = [c for c in keep if c.status in TERMINAL and original[c.id][0] not in TERMINAL]
            if ended:
                charges.charge_cases(cases=ended, now=timezone.now())
        if release:
            Case.objects.filter(id__in=release, lease_owner=owner).update(lease_owner="", lease_until=None)
        kept = {case.id for case in keep}
        kept_events = [event for event in events if event.case_id in kept]
        if kept_events:
            CaseEvent.objects.bulk_create(kept_events)
            # R-NOTE-1: one outbox statement for the pass's ended cases, in this transaction.
            by_id = {case.id: case for case in keep}
            notify_cases_ended([(by_id[e.case_id], e.to_status, e.at) for e in kept_events if e.to_status in ENDS])
    report.recorded += len(keep)
    report.transitions += [(str(e.case_id), e.from_status, e.to_status) for e in kept_events if e.to_status]


#: the ends a case's owner may be told about (a cancel is their own or staff's doing)
ENDS = {CaseStatus.DONE: Event.CASE_FINISHED, CaseStatus.FAILED: Event.CASE_FAILED}


def notify_cases_ended(ended: list[tuple[Case, str, datetime]]) -> None:
    """Outbox rows for cases that reached ``done`` or ``failed`` (none when none did)."""
    notifications.notify_many(
        (
            ENDS[status],
            case.owner_id,
            f"case:{case.id}",
            {
                "summary": f"Case {case.name} {'finished' if status == CaseStatus.DONE else 'failed'}",
                "case": {"id": str(case.id), "name": case.name, "status": status, "campaign": case.campaign_id},
                "finished_at": at,
            },
        )
        for case, status, at in ended
        if status in ENDS
    )


def _transition(case: Case, to: str, now: datetime, message: str, events: list[CaseEvent]) -> None:
    events.append(CaseEvent(case_id=case.id, at=now, from_status=case.status, to_status=to, message=message[:2000]))
    case.status = to


# -- poll and finalize ---------------------------------------------------------------------------
def apply_state(case: Case, result, backend, now: datetime, events: list[CaseEvent]) -> None:
    """Turn one poll answer into the case's new state (in memory; the caller records it)."""
    case.last_polled_at = now
    if isinstance(result, CredentialsRequired):
        wait_for_owner(case, result, now, events)
        return
    if isinstance(result, Exception):
        # R-CASE-3: a failed poll changes nothing but the counters, and backs off.
        case.poll_failures += 1
        case.last_error = f"poll failed: {result}"[:2000]
        case.next_poll_at = now + backoff(case.poll_failures)
        if cases_root.is_disk_full(result):
            # The cases disk is full (a backend copying the command's output into the logs): what
            # the command wrote meanwhile on that disk may be lost; its logs say so once there is room.
            case.log_gap = workspace.widen_log_gap(case.log_gap, now, None)
        return
    state: BackendState = result
    root = workspace.case_dir(case.id)
    if case.log_gap and workspace.write_log_gap_notes(root, case.log_gap):
        case.log_gap = {}  # noted, before what comes after it
    lost = workspace.append_logs(root, state.stdout_delta, state.stderr_delta)  # R-CASE-5
    if lost:
        logger.warning("case %s: the cases disk is full: %s of its output not kept", case.id, lost)
        case.log_gap = workspace.widen_log_gap(case.log_gap, now, lost)
    case.poll_failures = 0
    case.last_error = ""
    case.next_poll_at = now + timedelta(seconds=settings.GRIDGATE_CASE_POLL_SECONDS)
    if state.execution_time is not None:
        case.execution_time = state.execution_time
    if state.cores is not None:
        case.cores = state.cores
    if state.progress is not None and state.status not in BackendStatus.TERMINAL:
        case.progress = state.progress
    # The provider's word on a waiting or running job (Slurm's pending reason: JobHeldAdmin,
    # Resources) reaches the case, and each new one its history; a finished job has none.
    note = "" if state.status in BackendStatus.TERMINAL else (state.message or "")[:500]
    if note != case.status_message:
        case.status_message = note
        if note:
            events.append(CaseEvent(case_id=case.id, at=now, kind=CaseEvent.Kind.NOTE, message=note))

    if state.status == BackendStatus.RUNNING and case.status == CaseStatus.PENDING:
        case.started_at = case.started_at or now
        case.next_sync_at = now
        _transition(case, CaseStatus.RUNNING, now, "started", events)
    elif state.status == BackendStatus.SUCCEEDED:
        finalize(case, backend, now, events)
    elif state.status == BackendStatus.FAILED:
        # R-CASE-4: fetch what can be fetched (logs, partial results), then fail.
        try:
            backend.fetch_final(job_ref(case))
        except Exception as exc:
            logger.info("case %s: partial results not fetched after failure: %s", case.id, exc)
        case.finished_at = now
        case.last_error = (state.message or "the remote job failed")[:2000]
        _transition(case, CaseStatus.FAILED, now, case.last_error, events)
    elif state.status == BackendStatus.CANCELLED:
        case.finished_at = now
        _transition(case, CaseStatus.CANCELLED, now, state.message or "cancelled on the provider's side", events)


def wait_for_owner(case: Case, exc: CredentialsRequired, now: datetime, events: list[CaseEvent]) -> None:
    """The owner's own credential for a per-user pool expired or was revoked: nothing can be asked
    for this case until they reconnect. Not a failed poll and no state change (the job may well
    be running): the case says it waits for its owner, in its status message and once in its
    history, and is looked at again when they reconnect (``credential_services.resume_waiting_cases``
    makes it due) or after the longest back-off."""
    note = f"waiting for its owner to reconnect: {exc}"[:500]
    if note != case.status_message:
        case.status_message = note
        events.append(CaseEvent(case_id=case.id, at=now, kind=CaseEvent.Kind.NOTE, message=note))
    case.next_poll_at = now + timedelta(seconds=settings.GRIDGATE_CASE_MAX_BACKOFF_SECONDS)


def finalize(case: Case, backend, now: datetime, events: list[CaseEvent]) -> None:
    """R-CASE-4: done only once fetch_final succeeded; otherwise stay running and retry."""
    try:
        backend.fetch_final(job_ref(case))
    except CredentialsRequired as exc:  # the results wait for the owner's reconnect, the state too
        wait_for_owner(case, exc, now, events)
        return
    except ResultsTooLarge as exc:  # retrying cannot help: the case fails saying why
        case.finished_at = now
        case.next_poll_at = None
        case.next_sync_at = None
        case.last_error = str(exc)[:2000]
        _transition(case, CaseStatus.FAILED, now, case.last_error, events)
        return
    except Exception as exc:
        case.poll_failures += 1
        case.last_error = f"fetching results failed: {exc}"[:2000]
        case.next_poll_at = now + backoff(case.poll_failures)
        if case.status == CaseStatus.PENDING:
            case.started_at = case.started_at or now
            _transition(case, CaseStatus.RUNNING, now, "finished remotely; fetching results", events)
        return
    case.results_fetched = True
    case.progress = 1.0  # R-CASE-5: terminal progress is final, never a stale synced marker
    case.started_at = case.started_at or now
    case.finished_at = now
    case.next_poll_at = None
    case.next_sync_at = None
    _transition(case, CaseStatus.DONE, now, "results fetched", events)


def poll_pass(
    *,
    now: datetime | None = None,
    owner: str | None = None,
    batch: int | None = None,
    case_ids=None,
    host_only: bool = False,
):
    """Poll every due pending/running case once: at most one backend status call per case (or
    one per batch where the backend batches)."""
    now = now or timezone.now()
    owner = owner or worker_id()
    report = PassReport()
    batch = batch or settings.GRIDGATE_CASE_PASS_BATCH
    ids, cases = _claim_and_load(
        "poll", report, now=now, owner=owner, batch=batch, case_ids=case_ids, host_only=host_only
    )
    if not ids:
        return report
    original = {case.id: (case.status, case.remote_id) for case in cases}
    held = Leases(ids, owner, now)
    events: list[CaseEvent] = []
    by_backend: dict[str, list[Case]] = {}
    for case in cases:
        by_backend.setdefault(case.backend, []).append(case)
    for name, group in by_backend.items():
        try:
            backend = get_backend(name)
        except Exception as exc:
            for case in group:
                apply_state(case, exc, None, now, events)
            continue
        with held.kept_alive():
            # A local cancel waits out its grace (GRIDGATE_CASE_CANCEL_GRACE_SECONDS) per case: a
            # batch of them can outlast the lease, so the heartbeat covers them too.
            _carry_out_cancels(backend, group)
            answers = backend.poll_many([job_ref(case) for case in group])  # no transaction open
            held.renew(force=True)
            for case in group:
                if case.id not in held.renew():
                    # Our lease expired during the provider call and another worker took the case:
                    # it appends this delta itself. Appending it here too would write it twice.
                    continue
                result = answers.get(case.remote_id)
                if result is None:
                    result = RuntimeError(f"the {name} backend gave no answer for {case.remote_id}")
                try:
                    apply_state(case, result, backend, now, events)  # may fetch_final: long
                except Exception as exc:  # a local disk error must not lose the other cases' outcomes
                    logger.exception("case %s: applying the poll result failed", case.id)
                    apply_state(case, exc, backend, now, events)
    _record(cases, original, owner, POLL_FIELDS, events, report)
    return report


def _carry_out_cancels(backend, cases: list[Case]) -> None:
    """A cancel asked on another host than the one running a host-bound case (R-CASE-6) is carried
    out here, on the run host, before the poll that then reports it cancelled. A failed attempt is
    retried at the next poll; the poll itself goes on."""
    for case in cases:
        if case.cancel_requested_at is None:
            continue
        try:
            backend.cancel(job_ref(case))
        except AlreadyFinished:
            pass  # it ended on its own first: the poll records how
        except Exception as exc:
            logger.warning("case %s: the requested cancel failed, retried at the next poll: %s", case.id, exc)


# -- sync ----------------------------------------------------------------------------------------
def sync_pass(
    *,
    now: datetime | None = None,
    owner: str | None = None,
    batch: int | None = None,
    case_ids=None,
    host_only: bool = False,
):
    """Pull the observability globs and the progress marker of running cases into ``live/``."""
    now = now or timezone.now()
    owner = owner or worker_id()
    report = PassReport()
    batch = batch or settings.GRIDGATE_CASE_PASS_BATCH
    ids, cases = _claim_and_load(
        "sync", report, now=now, owner=owner, batch=batch, case_ids=case_ids, host_only=host_only
    )
    if not ids:
        return report
    original = {case.id: (case.status, case.remote_id) for case in cases}
    interval = timedelta(seconds=settings.GRIDGATE_CASE_SYNC_SECONDS)
    held = Leases(ids, owner, now)
    for case in cases:
        case.next_sync_at = now + interval
        if case.id not in held.renew():
            continue  # taken over by another worker: it syncs the case (the write-back skips it)
        try:
            backend = get_backend(case.backend)
            with held.kept_alive():  # one sync of big files can outlast the lease
                backend.sync(job_ref(case), list(case.observability_globs or []))
        except Exception as exc:
            case.last_error = f"sync failed: {exc}"[:2000]
            continue
        case.last_synced_at = now
        # R-CASE-5: the marker is read only while the case runs (the status is re-checked under
        # the lock at write-back), so a terminal case never takes a stale synced value.
        marker = files.read_progress(workspace.case_dir(case.id) / "live" / files.PROGRESS_FILE)
        if marker is not None:
            case.progress = marker
    _record(cases, original, owner, SYNC_FIELDS, [], report)
    return report


# -- submit (the worker half of a launch, R-CASE-1) -------------------------------------------------
#: submission attempts that end transient or uncertain before the case is failed
MAX_SUBMIT_ATTEMPTS = 5
#: lease owner of a launch waiting out its back-off: no worker holds it, the lease is the timer
SUBMIT_RETRY = "submit-retry"


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
        launch = Case.objects.filter(pk=self.case_id, status=CaseStatus.PREPARED)
        if not leases.renew(launch, owner=self.owner, until=timezone.now() + timedelta(seconds=lease_seconds())):
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
        campaign_id=str(case.campaign_id) if case.campaign_id else None,
        run_as=run_as(case),
        bounds=case_bounds(resource_class),
        identity=remote_identity(case),
    )


def _event(case_id, now, *, kind=CaseEvent.Kind.TRANSITION, from_status="", to_status="", message=""):
    CaseEvent.objects.create(
        case_id=case_id, at=now, kind=kind, from_status=from_status, to_status=to_status, message=message[:2000]
    )


def submit_pass(
    *, now: datetime | None = None, owner: str | None = None, batch: int = 20, case_ids=None, host_only: bool = False
):
    """Submit the cases whose launch was requested (R-CASE-1): the upload and the provider call
    happen here, in a worker, never in the request that asked for the launch. Also resumes a
    launch whose worker died (its lease expired) and retries a transient or uncertain one once
    its back-off (the lease) has passed; the backend looks the job up by name first, so a job
    that did reach the provider is adopted, never submitted twice."""
    now = now or timezone.now()
    owner = owner or worker_id()
    report = PassReport()
    _, cases = _claim_and_load(
        "submit", report, now=now, owner=owner, batch=batch, case_ids=case_ids, host_only=host_only
    )
    for case in cases:
        if submit_claimed(case, owner=owner):
            report.recorded += 1
        else:
            report.skipped += 1
    return report


def orphan_cancel_pass(
    *, now: datetime | None = None, owner: str | None = None, batch: int = 20, host_only: bool = False
):
    """Stop what a cancelled launch may have started on this host (R-CASE-6).

    A case cancelled while prepared, with its launch requested and pinned to this host, from a
    process on another host (``cancel_requested_at``, set by ``services.cancel_case``): the worker
    that pinned it may have started its process and died before recording it. Only this host's
    /proc can find that process, so the cancel is carried out here; the request is cleared once
    nothing is left running, and a failed attempt is retried when its lease has expired."""
    now = now or timezone.now()
    owner = owner or worker_id()
    report = PassReport()
    ids, cases = _claim_and_load("orphan", report, now=now, owner=owner, batch=batch, host_only=host_only)
    if not ids:
        return report
    held = Leases(ids, owner, now)
    with held.kept_alive():  # each local cancel may wait out its grace period
        for case in cases:
            if case.id not in held.renew() or not cancel_orphan(case):
                report.skipped += 1  # taken over meanwhile, or failed: the lease times the retry
                continue
            report.recorded += Case.objects.filter(pk=case.pk, lease_owner=owner).update(
                cancel_requested_at=None, lease_owner="", lease_until=None
            )
    return report


def submit_claimed(case: Case, *, owner: str) -> bool:
    """Submit a case whose launch lease ``owner`` holds; returns True if the outcome was recorded.

    Claim, call, record: the lease is renewed first (a case late in a batch may have waited out
    its lease) and while the backend prepares the submission (``spec.keepalive``); a lease lost
    meanwhile stops the attempt before anything is submitted. The outcome is written only while
    the case is still ours and prepared; a cancel that landed meanwhile wins, and the job the
    submission created is cancelled rather than left running unrecorded (R-CASE-1, R-CASE-6)."""
    lease = LaunchLease(case.pk, owner)
    try:
        lease.renew()
    except LeaseLost:
        logger.info("case %s: launch lease lost before submitting; left to its new holder", case.id)
        return False
    pool = case.resource_class.pool
    backend, remote_id, error, transient, spec = None, None, "", False, None
    try:
        spec = build_spec(case)
        spec.keepalive = lease.renew
        backend = get_backend(case.backend)
        if backend.host_bound:
            _pin_to_this_host(case, owner)
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
    except BackendError as exc:
        # Transient (a busy controller, a token in its refusal window) or uncertain (the answer
        # was lost): retried with back-off. Anything else refuses the case for good.
        error, transient = scrub_for_pool(pool, str(exc)), exc.transient
        if isinstance(exc, SubmitUncertain):
            error = f"submission uncertain: {error}"
    except Exception as exc:  # an SDK's own exception type: still a failed submission, never stuck
        error = scrub_for_pool(pool, f"{type(exc).__name__}: {exc}")
        logger.error("case %s: submission raised %s", case.id, error)
    now = timezone.now()
    attempts = case.poll_failures + 1  # unused while prepared: counts the submission attempts
    if not remote_id and transient and attempts < MAX_SUBMIT_ATTEMPTS:
        return _retry_submit(case, owner=owner, error=error, attempts=attempts, now=now)
    with transaction.atomic():
        fields = {"lease_owner": "", "lease_until": None}
        if remote_id:
            identity = spec.identity.label if spec is not None and spec.identity is not None else ""
            fields.update(
                status=CaseStatus.PENDING,
                remote_id=str(remote_id),
                remote_identity=identity[:300],
                submitted_at=now,
                next_poll_at=now,
                poll_failures=0,
                last_error="",
            )
            # Per-user credentials: the identity the job runs under, in the case's history too.
            message = f"submitted as {remote_id}" + (f" under {identity}" if identity else "")
        else:
            if transient:
                error = f"submission failed {attempts} times, last: {error}"
            fields.update(status=CaseStatus.FAILED, last_error=error[:2000], finished_at=now)
            message = f"submission failed: {error}"
        updated = Case.objects.filter(pk=case.pk, lease_owner=owner, status=CaseStatus.PREPARED).update(**fields)
        if updated:
            _event(case.pk, now, from_status=CaseStatus.PREPARED, to_status=fields["status"], message=message)
            if fields["status"] == CaseStatus.FAILED:
                notify_cases_ended([(case, CaseStatus.FAILED, now)])
    if not updated:
        current = Case.objects.filter(pk=case.pk).values_list("status", flat=True).first()
        if remote_id and current == CaseStatus.CANCELLED:
            # Cancelled while the submission was in flight: do not leave an orphan job running.
            _cancel_orphan(backend, case, spec, remote_id)
        return False
    if remote_id:
        enqueue_poll([case.id])
    elif transient and backend is not None and spec is not None:
        # The last attempt was uncertain too: the provider may have queued a job after all.
        # Look once more and cancel it, rather than leave it running (and billing) unrecorded.
        _cancel_orphan(backend, case, spec, None)
    return True


def _pin_to_this_host(case: Case, owner: str) -> None:
    """Pin a host-bound case to this host before its process starts (never after: a worker dying in
    between would leave a process no host claims). A retry is then this host's too. Compare-and-set
    on the launch lease: a lost lease stops the attempt."""
    host = this_host()
    pinned = Case.objects.filter(
        pk=case.pk, lease_owner=owner, status=CaseStatus.PREPARED, run_host__in=["", host]
    ).update(run_host=host)
    if not pinned:
        raise LeaseLost("the launch was taken over, cancelled or pinned to another host meanwhile")
    case.run_host = host


def _retry_submit(case: Case, *, owner: str, error: str, attempts: int, now: datetime) -> bool:
    """Stay prepared, keep the launch request, and let the submit pass retry once the back-off
    (the lease, held by no worker) expires. The retry calls ``find`` first, so a job that did
    reach the provider is adopted, never submitted twice (R-CASE-1)."""
    with transaction.atomic():
        updated = Case.objects.filter(pk=case.pk, lease_owner=owner, status=CaseStatus.PREPARED).update(
            poll_failures=attempts,
            last_error=f"submission attempt {attempts} of {MAX_SUBMIT_ATTEMPTS} failed, will retry: {error}"[:2000],
            lease_owner=SUBMIT_RETRY,
            lease_until=now + backoff(attempts),
        )
        if updated:
            _event(case.pk, now, kind=CaseEvent.Kind.ERROR, message=f"submission failed, will retry: {error}")
    return bool(updated)


def cancel_orphan(case: Case) -> bool:
    """A case cancelled after its launch was requested: the provider may hold a job for it (an
    uncertain submission, a submission in flight). Look it up by name and stop it (R-CASE-6).
    True when nothing is left running (none found, stopped, ended already)."""
    try:
        return _cancel_orphan(get_backend(case.backend), case, build_spec(case), None)
    except Exception as exc:
        logger.warning("case %s: a job left by its launch may still run: %s", case.id, type(exc).__name__)
        return False


def _cancel_orphan(backend, case: Case, spec: SubmitSpec, remote_id: str | None) -> bool:
    pool = case.resource_class.pool
    try:
        remote_id = remote_id or backend.find(spec)
        if not remote_id:
            return True
        backend.cancel(JobRef(str(case.id), str(remote_id), spec.workspace, spec.pool_remote, identity=spec.identity))
    except AlreadyFinished:
        return True
    except Exception as exc:
        logger.warning(
            "case %s: orphan job %s not cancelled: %s",
            case.id,
            remote_id,
            scrub_for_pool(pool, f"{type(exc).__name__}: {exc}"),
        )
        return False
    logger.info("case %s: cancelled the orphan job %s its launch left", case.id, remote_id)
    _event(case.pk, timezone.now(), kind=CaseEvent.Kind.CANCEL, message=f"cancelled the orphan job {remote_id}")
    return True
