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
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.backends import files
from apps.backends.base import BackendState, BackendStatus, JobRef
from apps.backends.registry import get_backend
from apps.cases import workspace
from apps.cases.models import ACTIVE, Case, CaseEvent, CaseStatus

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
    "results_fetched",
    "next_poll_at",
    "next_sync_at",
    "lease_owner",
    "lease_until",
]
SYNC_FIELDS = ["progress", "last_synced_at", "next_sync_at", "last_error", "lease_owner", "lease_until"]


def worker_id() -> str:
    """Unique per pass: host, process, thread and a nonce (two passes never share a lease)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{threading.get_ident() % 100000}:{uuid.uuid4().hex[:8]}"


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
        pool_remote=case.resource_class.pool.remote or {},
    )


@dataclass
class PassReport:
    claimed: int = 0
    recorded: int = 0
    skipped: int = 0
    transitions: list[tuple[str, str, str]] = field(default_factory=list)

    def __str__(self):
        return f"claimed {self.claimed}, recorded {self.recorded}, skipped {self.skipped}"


# -- claim -----------------------------------------------------------------------------------------
def _lease_free(now: datetime) -> Q:
    return Q(lease_until__isnull=True) | Q(lease_until__lt=now)


def claim(kind: str, *, now: datetime, owner: str, batch: int, case_ids=None) -> list:
    """Lease up to ``batch`` due cases to ``owner``; returns their ids (R-CASE-2)."""
    queryset = Case.objects.filter(_lease_free(now))
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
    else:  # pragma: no cover - programming error
        raise ValueError(kind)
    if case_ids is not None:
        queryset = queryset.filter(id__in=list(case_ids))
    with transaction.atomic():
        # skip_locked: rows another worker is claiming right now are simply left to it.
        ids = list(queryset.select_for_update(skip_locked=True).values_list("id", flat=True)[:batch])
        if ids:
            Case.objects.filter(id__in=ids).update(
                lease_owner=owner, lease_until=now + timedelta(seconds=lease_seconds())
            )
    return ids


class Leases:
    """The leases a pass holds, renewed while it works through a long batch (a slow provider, big
    downloads): a lease that expired mid-pass lets another worker take the case and do the same
    work twice (two appends of one log delta, two downloads). Renewal is throttled to a quarter of
    the lease; :attr:`held` is what is still ours."""

    def __init__(self, ids, owner: str, now: datetime):
        self.owner = owner
        self.now = now
        self.started = self.renewed = time.monotonic()
        self.held = set(ids)

    def renew(self, *, force: bool = False) -> set:
        clock = time.monotonic()
        if not self.held or (not force and clock - self.renewed < lease_seconds() / 4):
            return self.held
        until = self.now + timedelta(seconds=clock - self.started + lease_seconds())
        with transaction.atomic():
            mine = Case.objects.filter(id__in=list(self.held), lease_owner=self.owner)
            mine.update(lease_until=until)
            self.held = set(mine.values_list("id", flat=True))
        self.renewed = clock
        return self.held


def _load(ids, owner) -> list[Case]:
    return list(Case.objects.filter(id__in=ids, lease_owner=owner).select_related("resource_class__pool"))


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
        if release:
            Case.objects.filter(id__in=release, lease_owner=owner).update(lease_owner="", lease_until=None)
        kept = {case.id for case in keep}
        kept_events = [event for event in events if event.case_id in kept]
        if kept_events:
            CaseEvent.objects.bulk_create(kept_events)
    report.recorded += len(keep)
    report.transitions += [(str(e.case_id), e.from_status, e.to_status) for e in kept_events if e.to_status]


def bulk_write(cases: list[Case], fields: list[str]) -> None:
    """One UPDATE for all rows. On PostgreSQL ``UPDATE … FROM (VALUES …)``: Django's bulk_update
    builds a CASE WHEN per field and row, which made the write-back most of a 1 000-case pass."""
    if connection.vendor != "postgresql":
        Case.objects.bulk_update(cases, fields)
        return
    model_fields = [Case._meta.get_field(name) for name in fields]
    table = connection.ops.quote_name(Case._meta.db_table)
    pk_column = connection.ops.quote_name(Case._meta.pk.column)
    columns = [connection.ops.quote_name(field.column) for field in model_fields]
    sets = ", ".join(
        f"{column} = CAST(v.c{i} AS {field.db_type(connection)})"
        for i, (column, field) in enumerate(zip(columns, model_fields, strict=True))
    )
    names = ", ".join(["pk"] + [f"c{i}" for i in range(len(fields))])
    row = "(" + ", ".join(["%s"] * (len(fields) + 1)) + ")"
    params = []
    for case in cases:
        params.append(str(case.pk))
        params += [field.get_db_prep_save(getattr(case, field.attname), connection) for field in model_fields]
    # Only model metadata (quoted names, column types) is interpolated; every value is a parameter.
    values = ", ".join([row] * len(cases))
    sql = (
        f"UPDATE {table} SET {sets} FROM (VALUES {values}) AS v({names}) WHERE {table}.{pk_column} = CAST(v.pk AS uuid)"  # noqa: S608, E501
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _transition(case: Case, to: str, now: datetime, message: str, events: list[CaseEvent]) -> None:
    events.append(CaseEvent(case_id=case.id, at=now, from_status=case.status, to_status=to, message=message[:2000]))
    case.status = to


# -- poll and finalize ---------------------------------------------------------------------------
def apply_state(case: Case, result, backend, now: datetime, events: list[CaseEvent]) -> None:
    """Turn one poll answer into the case's new state (in memory; the caller records it)."""
    case.last_polled_at = now
    if isinstance(result, Exception):
        # R-CASE-3: a failed poll changes nothing but the counters, and backs off.
        case.poll_failures += 1
        case.last_error = f"poll failed: {result}"[:2000]
        case.next_poll_at = now + backoff(case.poll_failures)
        return
    state: BackendState = result
    root = workspace.case_dir(case.id)
    workspace.append_logs(root, state.stdout_delta, state.stderr_delta)  # R-CASE-5
    case.poll_failures = 0
    case.last_error = ""
    case.next_poll_at = now + timedelta(seconds=settings.GRIDGATE_CASE_POLL_SECONDS)
    if state.execution_time is not None:
        case.execution_time = state.execution_time
    if state.cores is not None:
        case.cores = state.cores
    if state.progress is not None and state.status not in BackendStatus.TERMINAL:
        case.progress = state.progress

    if state.status == BackendStatus.RUNNING and case.status == CaseStatus.PENDING:
        case.started_at = case.started_at or now
        case.next_sync_at = now
        _transition(case, CaseStatus.RUNNING, now, state.message or "started", events)
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


def finalize(case: Case, backend, now: datetime, events: list[CaseEvent]) -> None:
    """R-CASE-4: done only once fetch_final succeeded; otherwise stay running and retry."""
    try:
        backend.fetch_final(job_ref(case))
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


def poll_pass(*, now: datetime | None = None, owner: str | None = None, batch: int | None = None, case_ids=None):
    """Poll every due pending/running case once: at most one backend status call per case (or
    one per batch where the backend batches)."""
    now = now or timezone.now()
    owner = owner or worker_id()
    report = PassReport()
    ids = claim("poll", now=now, owner=owner, batch=batch or settings.GRIDGATE_CASE_PASS_BATCH, case_ids=case_ids)
    report.claimed = len(ids)
    if not ids:
        return report
    cases = _load(ids, owner)
    original = {case.id: (case.status, case.remote_id) for case in cases}
    leases = Leases(ids, owner, now)
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
        answers = backend.poll_many([job_ref(case) for case in group])  # no transaction open
        leases.renew(force=True)
        for case in group:
            if case.id not in leases.renew():
                # Our lease expired during the provider call and another worker took the case:
                # it appends this delta itself. Appending it here too would write it twice.
                continue
            result = answers.get(case.remote_id)
            if result is None:
                result = RuntimeError(f"the {name} backend gave no answer for {case.remote_id}")
            try:
                apply_state(case, result, backend, now, events)
            except Exception as exc:  # a local disk error must not lose the other cases' outcomes
                logger.exception("case %s: applying the poll result failed", case.id)
                apply_state(case, exc, backend, now, events)
    _record(cases, original, owner, POLL_FIELDS, events, report)
    return report


# -- sync ----------------------------------------------------------------------------------------
def sync_pass(*, now: datetime | None = None, owner: str | None = None, batch: int | None = None, case_ids=None):
    """Pull the observability globs and the progress marker of running cases into ``live/``."""
    now = now or timezone.now()
    owner = owner or worker_id()
    report = PassReport()
    ids = claim("sync", now=now, owner=owner, batch=batch or settings.GRIDGATE_CASE_PASS_BATCH, case_ids=case_ids)
    report.claimed = len(ids)
    if not ids:
        return report
    cases = _load(ids, owner)
    original = {case.id: (case.status, case.remote_id) for case in cases}
    interval = timedelta(seconds=settings.GRIDGATE_CASE_SYNC_SECONDS)
    leases = Leases(ids, owner, now)
    for case in cases:
        case.next_sync_at = now + interval
        if case.id not in leases.renew():
            continue  # taken over by another worker: it syncs the case (the write-back skips it)
        try:
            backend = get_backend(case.backend)
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


# -- submit (launch and its recovery) ------------------------------------------------------------
def submit_pass(*, now: datetime | None = None, owner: str | None = None, batch: int = 20):
    """Resume launches whose submitting process died (R-CASE-1): the backend looks the job up by
    name first, so a job that did reach the provider is adopted, never submitted twice."""
    from apps.cases.services import submit_claimed

    now = now or timezone.now()
    owner = owner or worker_id()
    report = PassReport()
    ids = claim("submit", now=now, owner=owner, batch=batch)
    report.claimed = len(ids)
    for case in _load(ids, owner):
        if submit_claimed(case, owner=owner):
            report.recorded += 1
        else:
            report.skipped += 1
    return report
