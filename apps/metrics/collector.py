"""The state metrics of ``/metrics``, read from the database at scrape time (docs/metrics.md).

Why a custom collector reading the database rather than counters kept in process memory: the
web and worker processes are many and on several hosts, and the state (slots held, jobs
waiting, cases polling, heartbeats) lives in PostgreSQL, which every scrape of any web process
sees whole. Each family costs one grouped query whose cost follows the *current* state, never
the history, because each is served by a partial index over unfinished rows or reads a small
table:

============================  ================================================================
pools, devices, heartbeats    small tables (one row per pool / device / worker host)
licences                      ``LicenceState``: one row per pool with a Slurm licence
slots and quota used          the pool rows' usage counters (``apps.sessions.statements``)
jobs per state / device       status IN (pending, running): ``jobs_unfinished_session``
cases per state               status IN (prepared, pending, running): ``cases_case_unfinished``
latency histograms            ``JobLatencyBucket``: a few rows per pool, counted at the event
allocations                   ``Allocation``: one row per project and pool, set by operators
============================  ================================================================

Eight queries per scrape whatever the number of pools, jobs or cases (a test keeps it so), and
for ``gridgate_pending_jobs`` a few more per pool with pending jobs: each such pool's queue
snapshot (``apps.scheduling.selectors``, shared with the job lists for 5 s), whose cost follows
the pending jobs, never the history;
``bench/metrics_scrape.py`` measures it with 100 000 finished jobs. Finished jobs and cases
are not counted here: that would scan the history on every scrape (the accounting API and
the utilization page report them).
"""

from django.db.models import BooleanField, Count, ExpressionWrapper, Q, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from apps.cases.models import Case, CaseStatus
from apps.core import cases_root
from apps.core.models import WorkerHeartbeat
from apps.licences.models import LicenceState
from apps.resources.models import ResourcePool, usage_of
from apps.scheduling import selectors
from apps.scheduling.latency import BUCKETS
from apps.scheduling.models import UNFINISHED, Device, Job, JobLatencyBucket, JobStatus, LatencyKind

#: case states reported (the unfinished ones); "submitting" is prepared with a launch requested
CASE_STATES = ("prepared", "submitting", CaseStatus.PENDING, CaseStatus.RUNNING)
CASE_UNFINISHED = (CaseStatus.PREPARED, CaseStatus.PENDING, CaseStatus.RUNNING)
QUOTA_RESOURCES = (("cpu", "quota_cpu"), ("memory_gb", "quota_memory"), ("gpu", "quota_gpu"))
HISTOGRAMS = {
    LatencyKind.QUEUE_WAIT: (
        "gridgate_job_queue_wait_seconds",
        "Time from a job's submission to its dispatch to a device, per dispatch.",
    ),
    LatencyKind.DISPATCH: (
        "gridgate_job_dispatch_seconds",
        "Time from a job's dispatch to its acceptance by the device's driver.",
    ),
    # A ratio: the bound's observed coverage is the le="1" bucket over the count (90 % promised).
    LatencyKind.ETA_BOUND: (
        "gridgate_job_eta_bound_ratio",
        "A dispatched job's wait over the bound it was shown (eta_p90_seconds): at most 1 when the bound held.",
    ),
}


class StateCollector:
    """A prometheus-client collector: every ``collect()`` reads the current state."""

    def describe(self):
        return []  # never collected at registration (that would query the database at import)

    def collect(self):
        now = timezone.now()
        pools = {pool.pk: pool for pool in ResourcePool.objects.select_related("usage").order_by("name")}
        names = {pk: pool.name for pk, pool in pools.items()}
        yield from self._pools(pools)
        yield from self._jobs(names, now)
        yield from self._latency(names)
        yield from self._cases(names)
        yield from self._workers(now)
        yield from self._licences(names, now)
        yield from self._disk()
        yield from self._allocations(now)

    # -- families -------------------------------------------------------------------------
    def _allocations(self, now):
        """R-ALLOC-1: each allocation's grant, its spending this period and what is left, per
        resource (device_seconds, core_hours; a resource not limited has no granted/remaining
        sample). One query over the allocations (an operator-sized table)."""
        from apps.allocations.models import INFINITY, Allocation

        labels = ["allocation", "project", "pool", "resource"]
        granted = GaugeMetricFamily(
            "gridgate_allocation_granted", "Granted per period (device seconds, core-hours).", labels=labels
        )
        used = GaugeMetricFamily("gridgate_allocation_used", "Spent in the current period.", labels=labels)
        remaining = GaugeMetricFamily(
            "gridgate_allocation_remaining", "Left in the current period (negative: overdrawn).", labels=labels
        )
        for allocation in Allocation.objects.select_related("pool", "user", "group").order_by("pk"):
            left = allocation.remaining_at(now)
            spent = allocation.used_in(allocation.period_at(now))
            for i, (resource, grant) in enumerate(
                (("device_seconds", allocation.device_seconds), ("core_hours", allocation.core_hours))
            ):
                key = [allocation.name, allocation.project, allocation.pool.name, resource]
                used.add_metric(key, spent[i])
                if grant is not None:
                    granted.add_metric(key, grant)
                    remaining.add_metric(key, left[i] if left[i] != INFINITY else grant)
        yield from (granted, used, remaining)

    def _disk(self):
        """The cases root's free space as this web host sees it (a shared file system: the same
        everywhere), and the floor below which launches are refused (GRIDGATE_CASES_MIN_FREE_MB).
        No sample when the root cannot be read."""
        free = GaugeMetricFamily(
            "gridgate_cases_root_free_bytes", "Free bytes on the file system of the cases root (GRIDGATE_CASES_ROOT)."
        )
        floor = GaugeMetricFamily(
            "gridgate_cases_root_min_free_bytes",
            "Below this much free space case launches are refused and health is degraded (GRIDGATE_CASES_MIN_FREE_MB).",
        )
        measured = cases_root.free_bytes()
        if measured is not None:
            free.add_metric([], measured)
        floor.add_metric([], cases_root.min_free_bytes())
        yield from (free, floor)

    def _pools(self, pools):
        total = GaugeMetricFamily(
            "gridgate_pool_slots_capacity",
            "Session capacity of the pool in slots (absent: unlimited).",
            labels=["pool"],
        )
        used = GaugeMetricFamily(
            "gridgate_pool_slots_used", "Slots held by the pool's active sessions.", labels=["pool"]
        )
        quota = GaugeMetricFamily(
            "gridgate_pool_quota", "The pool's resource quota (pools with a quota only).", labels=["pool", "resource"]
        )
        quota_used = GaugeMetricFamily(
            "gridgate_pool_quota_used",
            "Resources held by the pool's active sessions (their classes' cpu, memory in GB, gpu).",
            labels=["pool", "resource"],
        )
        repairs = CounterMetricFamily(
            "gridgate_pool_usage_repairs",
            "Times the expiry sweep found the pool's usage counters differing from its active sessions "
            "and repaired them (anything but 0 means sessions were changed behind admission's back).",
            labels=["pool"],
        )
        for pool in pools.values():
            usage = usage_of(pool)
            if pool.slots_total is not None:
                total.add_metric([pool.name], pool.slots_total)
            used.add_metric([pool.name], usage.slots_used)
            for resource, field in QUOTA_RESOURCES:
                value = {"cpu": usage.cpu_used, "memory_gb": usage.memory_used, "gpu": usage.gpu_used}[resource]
                quota_used.add_metric([pool.name, resource], float(value or 0))
                if pool.has_quota:  # the model's rule (ResourcePool.has_quota), not a copy of it
                    quota.add_metric([pool.name, resource], float(getattr(pool, field) or 0))
            repairs.add_metric([pool.name], usage.repairs)
        yield from (total, used, quota, quota_used, repairs)

    def _licences(self, names, now):
        count = GaugeMetricFamily(
            "gridgate_licence_count",
            "The count of the pool's Slurm licence as Gridgate last set or read it (0: closed).",
            labels=["pool", "licence"],
        )
        failures = GaugeMetricFamily(
            "gridgate_licence_sync_failures",
            "Failed syncs of the pool's Slurm licence in a row (sacctmgr or slurmdbd failing); 0 when the last worked.",
            labels=["pool"],
        )
        age = GaugeMetricFamily(
            "gridgate_licence_synced_age_seconds",
            "Seconds since Slurm last held the count the pool's licence should have.",
            labels=["pool"],
        )
        for state in LicenceState.objects.exclude(licence="", failures=0):
            pool = names.get(state.pool_id, str(state.pool_id))
            if state.licence and state.count is not None:
                count.add_metric([pool, state.licence], state.count)
            failures.add_metric([pool], state.failures)
            if state.synced_at is not None:
                age.add_metric([pool], max(0.0, (now - state.synced_at).total_seconds()))
        yield from (count, failures, age)

    def _jobs(self, names, now):
        jobs = GaugeMetricFamily("gridgate_jobs", "Unfinished jobs per pool and state.", labels=["pool", "status"])
        backoff = GaugeMetricFamily(
            "gridgate_jobs_backoff",
            "Pending jobs held back after a transient driver failure (their session's queue waits).",
            labels=["pool"],
        )
        running = GaugeMetricFamily(
            "gridgate_device_running_jobs", "Jobs running on the device.", labels=["pool", "device"]
        )
        capacity = GaugeMetricFamily(
            "gridgate_device_capacity", "Jobs the device runs at once (max_concurrent_jobs).", labels=["pool", "device"]
        )
        online = GaugeMetricFamily(
            "gridgate_device_online", "1 when the device takes jobs (online, provider up).", labels=["pool", "device"]
        )
        counts = {(pk, status): 0 for pk in names for status in sorted(UNFINISHED)}
        held_back = dict.fromkeys(names, 0)
        per_device = {}
        # status IN (pending, running) is the predicate of jobs_unfinished_session: the scan covers
        # the unfinished jobs only, however many finished ones the table holds.
        rows = (
            Job.objects.filter(status__in=sorted(UNFINISHED))
            .order_by()
            .values_list("pool_id", "device_id", "status")
            .annotate(n=Count("pk"), held=Count("pk", filter=Q(not_before__gt=now)))
        )
        for pool_id, device_id, status, n, held in rows:
            counts[(pool_id, status)] = counts.get((pool_id, status), 0) + n
            held_back[pool_id] = held_back.get(pool_id, 0) + held
            if status == JobStatus.RUNNING and device_id is not None:
                per_device[device_id] = per_device.get(device_id, 0) + n
        for (pool_id, status), n in counts.items():
            if pool_id in names:
                jobs.add_metric([names[pool_id], status], n)
        for pool_id, n in held_back.items():
            if pool_id in names:
                backoff.add_metric([names[pool_id]], n)
        for pk, pool_id, name, is_online, max_jobs in Device.objects.order_by("pool_id", "name").values_list(
            "pk", "pool_id", "name", "online", "max_concurrent_jobs"
        ):
            labels = [names.get(pool_id, str(pool_id)), name]
            running.add_metric(labels, per_device.get(pk, 0))
            capacity.add_metric(labels, max_jobs)
            online.add_metric(labels, 1 if is_online else 0)
        yield from (jobs, backoff, running, capacity, online)
        yield self._pending(names, [pool_id for (pool_id, status), n in counts.items() if status == "pending" and n])

    def _pending(self, names, pool_ids):
        """R-JOB-4 by reason: what ``pending_code`` says of each pending job (``queue_info``'s
        rule, from the pools' queue snapshots): no query while no job is pending."""
        family = GaugeMetricFamily(
            "gridgate_pending_jobs",
            "Pending jobs per pool and reason they wait (pending_code).",
            labels=["pool", "reason"],
        )
        for (pool_id, code), n in sorted(selectors.pending_by_reason(pool_ids).items()):
            if pool_id in names:
                family.add_metric([names[pool_id], code], n)
        return family

    def _latency(self, names):
        rows: dict[tuple, dict[float, tuple[int, float]]] = {}
        for pool_id, kind, le, count, total in JobLatencyBucket.objects.values_list(
            "pool_id", "kind", "le", "count", "sum"
        ):
            rows.setdefault((pool_id, kind), {})[le] = (count, total)
        for kind, (name, documentation) in HISTOGRAMS.items():
            family = HistogramMetricFamily(name, documentation, labels=["pool"])
            for pool_id, pool_name in names.items():
                counted = rows.get((pool_id, kind), {})
                buckets, cumulative, total = [], 0, 0.0
                # The configured bounds, plus any bound a row still has from an older configuration.
                for le in sorted(set(BUCKETS[kind]) | set(counted)):
                    count, part = counted.get(le, (0, 0.0))
                    cumulative += count
                    total += part
                    buckets.append((floatToGoString(le), cumulative))
                family.add_metric([pool_name], buckets, sum_value=total)
            yield family

    def _cases(self, names):
        cases = GaugeMetricFamily(
            "gridgate_cases",
            "Unfinished cases per pool and state (submitting: launch requested, not yet submitted).",
            labels=["pool", "status"],
        )
        failing = GaugeMetricFamily(
            "gridgate_cases_poll_failing",
            "Pending or running cases whose last poll (or result fetch) failed: each backs off.",
            labels=["pool"],
        )
        failures = GaugeMetricFamily(
            "gridgate_cases_poll_failures",
            "Consecutive failed polls, summed over the pool's pending and running cases.",
            labels=["pool"],
        )
        retrying = GaugeMetricFamily(
            "gridgate_cases_submit_retrying",
            "Submitting cases whose last submission attempt failed and that wait to retry.",
            labels=["pool"],
        )
        counts = {(pk, state): 0 for pk in names for state in CASE_STATES}
        failing_n, failures_n, retrying_n = dict.fromkeys(names, 0), dict.fromkeys(names, 0), dict.fromkeys(names, 0)
        submitting = ExpressionWrapper(Q(launch_requested_at__isnull=False), output_field=BooleanField())
        rows = (
            # The predicate of cases_case_unfinished (the cost follows the unfinished cases only).
            Case.objects.filter(status__in=CASE_UNFINISHED)
            .order_by()
            .values_list("resource_class__pool_id", "status", submitting)
            .annotate(
                n=Count("pk"),
                failing=Count("pk", filter=Q(poll_failures__gt=0)),
                failures=Sum("poll_failures"),
            )
        )
        for pool_id, status, is_submitting, n, failing_count, failure_sum in rows:
            if pool_id not in names:
                continue
            if status == CaseStatus.PREPARED:
                state = "submitting" if is_submitting else "prepared"
                if is_submitting:
                    retrying_n[pool_id] += failing_count  # while prepared, poll_failures counts attempts
            else:
                state = status
                failing_n[pool_id] += failing_count
                failures_n[pool_id] += failure_sum or 0
            counts[(pool_id, state)] += n
        for (pool_id, state), n in counts.items():
            cases.add_metric([names[pool_id], state], n)
        for pool_id, name in names.items():
            failing.add_metric([name], failing_n[pool_id])
            failures.add_metric([name], failures_n[pool_id])
            retrying.add_metric([name], retrying_n[pool_id])
        yield from (cases, failing, failures, retrying)

    def _workers(self, now):
        age = GaugeMetricFamily(
            "gridgate_worker_heartbeat_age_seconds",
            "Seconds since the worker host's ticker last beat (every GRIDGATE_WORKER_HEARTBEAT_SECONDS, 5 s default).",
            labels=["worker"],
        )
        seen = GaugeMetricFamily(
            "gridgate_worker_heartbeat_timestamp_seconds",
            "Unix time of the worker host's last heartbeat.",
            labels=["worker"],
        )
        for name, seen_at in WorkerHeartbeat.objects.order_by("name").values_list("name", "seen_at"):
            age.add_metric([name], max((now - seen_at).total_seconds(), 0.0))
            seen.add_metric([name], seen_at.timestamp())
        yield from (age, seen)
