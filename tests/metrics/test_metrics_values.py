"""/metrics read by prometheus-client's own parser, with known values set up."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from prometheus_client.parser import text_string_to_metric_families

from apps.cases.models import Case, CaseStatus
from apps.core.models import WorkerHeartbeat
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling import eta, latency
from apps.scheduling.models import Device, Job, JobStatus, LatencyKind
from apps.sessions import services as session_services

TOKEN = "t" * 32
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def scrape(client, **headers) -> dict:
    """{family name: {(sample name, frozenset(labels)): value}} of one authorised scrape."""
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **headers)
    assert response.status_code == 200, response.content
    families = {"types": {}}
    for family in text_string_to_metric_families(response.content.decode()):
        families["types"][family.name] = family.type
        families[family.name] = {
            (sample.name, frozenset(sample.labels.items())): sample.value for sample in family.samples
        }
    return families


def pools_in(families, family) -> set[str]:
    return {dict(labels)["pool"] for _, labels in families[family]}


def value(families, family, sample=None, **labels):
    return families[family][(sample or family, frozenset(labels.items()))]


@pytest.fixture
def metrics_on(settings):
    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    settings.GRIDGATE_METRICS_NETWORKS = ()


@pytest.fixture
def site(db, owner, member):
    """Two pools: "qpu" (10 slots, a quota, two devices) with sessions, jobs and cases; "cpu"
    (unlimited, no quota) with nothing."""
    qpu = ResourcePool.objects.create(
        name="qpu", kind="local", public=True, slots_total=10, quota_cpu=8, quota_memory=16, quota_gpu=1
    )
    qpu_class = ResourceClass.objects.create(pool=qpu, name="access", cpu=2, memory=4, gpu=0, default=True)
    cpu = ResourcePool.objects.create(name="cpu", kind="local", public=True)
    ResourceClass.objects.create(pool=cpu, name="small", cpu=1, memory=1, default=True)
    d1 = Device.objects.create(pool=qpu, name="d1", driver="fake", max_concurrent_jobs=2)
    Device.objects.create(pool=qpu, name="d2", driver="fake", online=False)

    s3 = session_services.admit(user=owner, resource_class=qpu_class, slots=3).session
    session_services.admit(user=member, resource_class=qpu_class, slots=2)
    gone = session_services.admit(user=member, resource_class=qpu_class, slots=4).session
    session_services.release(user=gone.user, session_id=gone.pk)  # a revoked session holds nothing

    def job(status, **fields):
        return Job.objects.create(
            session=s3, pool=qpu, user=owner, payload={}, shots=1, status=status, created_at=NOW, **fields
        )

    job(JobStatus.PENDING)
    job(JobStatus.PENDING)
    job(JobStatus.PENDING, not_before=NOW + timedelta(seconds=30), attempts=1)  # in back-off
    job(JobStatus.RUNNING, device=d1, remote_id="r1")
    job(JobStatus.RUNNING, device=d1, remote_id="r2")
    for _ in range(5):
        job(JobStatus.COMPLETED, finished_at=NOW)
    job(JobStatus.FAILED, finished_at=NOW)

    def case(status, **fields):
        return Case.objects.create(
            owner=owner, resource_class=qpu_class, name="c", command="run", status=status, **fields
        )

    case(CaseStatus.PREPARED)
    case(CaseStatus.PREPARED, launch_requested_at=NOW, poll_failures=1)  # submitting, retry pending
    case(CaseStatus.PENDING, poll_failures=2)
    case(CaseStatus.RUNNING)
    case(CaseStatus.RUNNING, poll_failures=3)
    for _ in range(4):
        case(CaseStatus.DONE, results_fetched=True)
    case(CaseStatus.FAILED)

    WorkerHeartbeat.objects.create(name="host-a", seen_at=NOW - timedelta(seconds=30))
    WorkerHeartbeat.objects.create(name="host-b", seen_at=NOW - timedelta(seconds=600))

    for seconds in (0.3, 0.5, 7, 100_000):
        latency.observe(qpu.pk, LatencyKind.QUEUE_WAIT, seconds)
    latency.observe(qpu.pk, LatencyKind.DISPATCH, 0.02)
    return qpu


@pytest.fixture
def families(site, metrics_on, client):
    with time_machine.travel(NOW, tick=False):
        return scrape(client)


def test_pool_slots_capacity_and_used(families):
    assert value(families, "gridgate_pool_slots_capacity", pool="qpu") == 10
    assert pools_in(families, "gridgate_pool_slots_capacity") == {"qpu"}  # "cpu" is unlimited
    assert value(families, "gridgate_pool_slots_used", pool="qpu") == 5  # 3 + 2; the released 4 are free
    assert value(families, "gridgate_pool_slots_used", pool="cpu") == 0


def test_pool_quota_and_quota_used(families):
    assert value(families, "gridgate_pool_quota", pool="qpu", resource="cpu") == 8
    assert value(families, "gridgate_pool_quota", pool="qpu", resource="memory_gb") == 16
    assert value(families, "gridgate_pool_quota", pool="qpu", resource="gpu") == 1
    assert value(families, "gridgate_pool_quota_used", pool="qpu", resource="cpu") == 4  # two sessions × 2
    assert value(families, "gridgate_pool_quota_used", pool="qpu", resource="memory_gb") == 8
    assert value(families, "gridgate_pool_quota_used", pool="qpu", resource="gpu") == 0
    assert pools_in(families, "gridgate_pool_quota") == {"qpu"}  # "cpu" has no quota
    assert pools_in(families, "gridgate_pool_quota_used") == {"qpu", "cpu"}


def test_pool_quota_is_exported_exactly_for_the_pools_the_model_says_have_one(site, metrics_on, client, monkeypatch):
    """One place per rule: the collector asks ResourcePool.has_quota, it does not re-derive it."""
    monkeypatch.setattr(ResourcePool, "has_quota", property(lambda pool: pool.name == "cpu"))
    families = scrape(client)
    assert pools_in(families, "gridgate_pool_quota") == {"cpu"}
    assert value(families, "gridgate_pool_quota", pool="cpu", resource="cpu") == 0  # no limit set: 0


def test_pending_jobs_per_pool_and_reason_they_wait(families):
    # d1 runs all it may (2 of 2), d2 is offline: two wait for a device, one in back-off.
    assert value(families, "gridgate_pending_jobs", pool="qpu", reason="device_busy") == 2
    assert value(families, "gridgate_pending_jobs", pool="qpu", reason="backoff") == 1
    assert pools_in(families, "gridgate_pending_jobs") == {"qpu"}  # "cpu" has none pending


def test_pending_and_running_jobs_per_pool(families):
    assert value(families, "gridgate_jobs", pool="qpu", status="pending") == 3
    assert value(families, "gridgate_jobs", pool="qpu", status="running") == 2
    assert value(families, "gridgate_jobs", pool="cpu", status="pending") == 0
    assert value(families, "gridgate_jobs_backoff", pool="qpu") == 1
    assert value(families, "gridgate_device_running_jobs", pool="qpu", device="d1") == 2
    assert value(families, "gridgate_device_capacity", pool="qpu", device="d1") == 2
    assert value(families, "gridgate_device_online", pool="qpu", device="d2") == 0


def test_queue_wait_histogram_is_cumulative_with_sum_and_count(families):
    name = "gridgate_job_queue_wait_seconds"
    assert families["types"][name] == "histogram"
    bucket = f"{name}_bucket"
    assert value(families, name, bucket, pool="qpu", le="0.1") == 0
    assert value(families, name, bucket, pool="qpu", le="0.5") == 2  # 0.3 and 0.5 (bounds are inclusive)
    assert value(families, name, bucket, pool="qpu", le="5.0") == 2
    assert value(families, name, bucket, pool="qpu", le="10.0") == 3
    assert value(families, name, bucket, pool="qpu", le="86400.0") == 3
    assert value(families, name, bucket, pool="qpu", le="+Inf") == 4
    assert value(families, name, f"{name}_count", pool="qpu") == 4
    assert value(families, name, f"{name}_sum", pool="qpu") == pytest.approx(100_007.8)
    assert value(families, name, f"{name}_count", pool="cpu") == 0


def test_dispatch_latency_histogram(families):
    name = "gridgate_job_dispatch_seconds"
    assert value(families, name, f"{name}_bucket", pool="qpu", le="0.01") == 0
    assert value(families, name, f"{name}_bucket", pool="qpu", le="0.05") == 1
    assert value(families, name, f"{name}_count", pool="qpu") == 1
    assert value(families, name, f"{name}_sum", pool="qpu") == pytest.approx(0.02)


def test_unfinished_case_states_per_pool(families):
    assert value(families, "gridgate_cases", pool="qpu", status="prepared") == 1
    assert value(families, "gridgate_cases", pool="qpu", status="submitting") == 1
    assert value(families, "gridgate_cases", pool="qpu", status="pending") == 1
    assert value(families, "gridgate_cases", pool="qpu", status="running") == 2
    assert value(families, "gridgate_cases", pool="cpu", status="running") == 0


def test_case_poll_failures_and_backoffs(families):
    assert value(families, "gridgate_cases_poll_failing", pool="qpu") == 2
    assert value(families, "gridgate_cases_poll_failures", pool="qpu") == 5
    assert value(families, "gridgate_cases_submit_retrying", pool="qpu") == 1


def test_worker_heartbeat_age(families):
    assert value(families, "gridgate_worker_heartbeat_age_seconds", worker="host-a") == 30
    assert value(families, "gridgate_worker_heartbeat_age_seconds", worker="host-b") == 600
    assert (
        value(families, "gridgate_worker_heartbeat_timestamp_seconds", worker="host-a")
        == (NOW - timedelta(seconds=30)).timestamp()
    )


def test_scrape_costs_the_same_queries_whatever_the_pools_jobs_and_cases(
    site, metrics_on, client, django_assert_num_queries, owner
):
    # 8 families' queries (allocations included), then for gridgate_pending_jobs: the pools, their
    # queue versions, the devices, running jobs, open calendar windows of now and the ETA's recorded
    # starts (6), and per pool with pending jobs its snapshot (4: its jobs, devices, measured device
    # times, the last hour's submissions).
    with django_assert_num_queries(8 + 6 + 4):
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    more = ResourcePool.objects.create(name="more", kind="local", public=True, slots_total=3)
    more_class = ResourceClass.objects.create(pool=more, name="c", cpu=1, memory=1, default=True)
    Device.objects.create(pool=more, name="m1", driver="fake")
    session = session_services.admit(user=owner, resource_class=more_class, slots=1).session
    Job.objects.bulk_create(
        Job(session=session, pool=more, user=owner, payload={}, shots=1, created_at=NOW, status=status)
        for status in [JobStatus.PENDING, JobStatus.COMPLETED] * 20
    )
    latency.observe(more.pk, LatencyKind.QUEUE_WAIT, 1)
    eta.clear_cache()  # each pool's snapshot rebuilt in full, its arrivals read again
    with django_assert_num_queries(8 + 6 + 4 * 2):
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    Job.objects.bulk_create(
        Job(session=session, pool=more, user=owner, payload={}, shots=1, created_at=NOW, status=status)
        for status in [JobStatus.PENDING, JobStatus.COMPLETED] * 200
    )
    eta.clear_cache()
    with django_assert_num_queries(8 + 6 + 4 * 2):  # ten times the jobs: the same queries
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")


@pytest.mark.django_db
@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text; version=1.0.0"])
def test_a_name_with_quotes_and_line_breaks_stays_one_label_value(client, metrics_on, accept):
    """Pool and device names (labels) are escaped by prometheus-client: a quote, a backslash or a
    line break in one cannot close its label or start a sample of its own."""
    name = 'lab"} 1\ngridgate_pool_slots_capacity{pool="forged'
    pool = ResourcePool.objects.create(name=name, kind="local", public=True, slots_total=3)
    Device.objects.create(pool=pool, name='emu\\"\r\n', driver="fake")
    families = scrape(client, HTTP_ACCEPT=accept)
    assert pools_in(families, "gridgate_pool_slots_capacity") == {name}
    assert value(families, "gridgate_pool_slots_capacity", pool=name) == 3
    assert {dict(labels)["device"] for _, labels in families["gridgate_device_online"]} == {'emu\\"\r\n'}
