"""Property-based fuzzing of the write endpoints: arbitrary JSON never yields a 5xx (SPEC §10)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.resources.models import ResourceClass, ResourcePool

pytestmark = pytest.mark.django_db

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "name",
    "kind",
    "quota",
    "remote",
    "classes",
    "cpu",
    "memory",
    "gpu",
    "default",
    "slots",
    "resource_class",
    "external_id",
    "slurm_job_id",
    "user",
    "payload",
    "shots",
    "device",
    "command",
    "launch_options",
    "inputs",
    "is_accessible",
    "message",
    "strategy",
    "share_by",
    "usage_half_life",
    "slots_total",
    "config",
    "driver",
    "pool",
]
bodies = st.one_of(json_values, st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6))
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def world(owner, staff):
    pool = ResourcePool.objects.create(name="fuzz", public=True, slots_total=5)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    from apps.scheduling.models import Device
    from apps.sessions import services

    Device.objects.create(pool=pool, name="emu", driver="emulator")
    session = services.admit(user=owner, resource_class=klass).session
    return {"pool": pool, "class": klass, "session": session}


def paths(world):
    return [
        ("post", "/api/v1/resource-pools/"),
        ("patch", f"/api/v1/resource-pools/{world['pool'].pk}/"),
        ("post", f"/api/v1/resource-pools/{world['pool'].pk}/classes/"),
        ("patch", f"/api/v1/resource-classes/{world['class'].pk}/"),
        ("put", f"/api/v1/resource-pools/{world['pool'].pk}/accessible/"),
        ("post", "/api/v1/sessions/"),
        ("post", f"/api/v1/sessions/{world['session'].pk}/jobs/"),
        ("post", "/api/v1/devices/"),
        ("post", "/api/v1/cases/"),
        ("post", "/api/v1/campaigns/"),
    ]


@FUZZ
@given(body=bodies, target=st.integers(0, 9), as_staff=st.booleans())
def test_arbitrary_json_bodies_never_cause_a_server_error(api, owner, staff, world, body, target, as_staff):
    method, path = paths(world)[target]
    response = getattr(api(staff if as_staff else owner), method)(path, body, format="json")
    assert response.status_code < 500, (method, path, body, response.content[:500])


# Date-shaped values that parse_datetime accepts or chokes on (a bare date, impossible dates).
DATES = st.sampled_from(["2026-01-01", "2026-13-45T00:00:00", "2026-02-30", "2026-01-01T00:00:00+25:00"])


@FUZZ
@given(
    query=st.dictionaries(
        st.sampled_from(
            ["page", "page_size", "cpu", "memory", "gpu", "status", "pool", "session", "user", "since", "until"]
        ),
        st.text(max_size=12) | DATES,
        max_size=4,
    )
)
def test_arbitrary_query_strings_never_cause_a_server_error(api, staff, world, query):
    for path in [
        "/api/v1/resource-pools/",
        "/api/v1/sessions/",
        "/api/v1/jobs/",
        "/api/v1/cases/",
        "/api/v1/devices/",
        "/api/v1/accounting/",
    ]:
        response = api(staff).get(path, query)
        assert response.status_code < 500, (path, query, response.content[:500])


def test_nul_byte_in_a_filter_is_a_400_not_a_500(api, staff, world):
    response = api(staff).get("/api/v1/sessions/", {"external_id": "a\x00b"})
    assert response.status_code in (200, 400)  # SQLite accepts NUL; PostgreSQL refuses it: 400
    assert api(staff).get("/api/v1/accounting/", {"user": "\x00"}).status_code in (200, 400)
