"""Schema-driven fuzzing of the live API (SPEC §10): every operation of the published OpenAPI
schema, as a user and as staff, with schemathesis. Checks: no server error, the status code is
documented, the content type is the documented one, the body matches the documented schema.

In-process (WSGI), fixed seed (hypothesis ``derandomize``) and a bounded number of examples per
operation, so the run is reproducible and fits the CI budget. The hypothesis fuzzing of
``test_fuzz.py`` stays: it throws arbitrary JSON at the write endpoints.
"""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from apps.accounts.services import issue_token
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 5  # per operation and identity: about 550 requests in all


@pytest.fixture
def world(owner, staff):
    """A little of everything the operations read: a pool with classes, a device, a session, a job."""
    from apps.scheduling import services as job_services
    from apps.sessions import services as session_services

    pool = ResourcePool.objects.create(name="fuzz", public=True, slots_total=50)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="fake1", driver="fake", config={"script": ["running", "completed"]})
    session = session_services.admit(user=owner, resource_class=klass).session
    job_services.submit_job(user=owner, session_id=session.pk, payload={"sequence": "{}"}, shots=1)
    return {"owner": issue_token(owner)[1], "staff": issue_token(staff)[1]}


def run_operations(token: str) -> list[str]:
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
    failures = []
    operations = [result.ok() for result in schema.get_all_operations()]
    # Revoking a token comes last: a generated id may be the one this run authenticates with, and
    # every operation after it would only be answered 401.
    operations.sort(key=lambda operation: operation.method.upper() == "DELETE" and "/auth/tokens/" in operation.path)
    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,  # a fixed seed: the same cases on every run
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case):
            case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)

        try:
            check()
        except (Exception, BaseExceptionGroup) as exc:  # report every operation's failure, not only the first
            failures.append(f"{operation.label}: {exc}"[:3000])
    return failures


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("who", ["owner", "staff"])
def test_every_operation_conforms_to_the_published_schema(world, who, cases_root):
    failures = run_operations(world[who])
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


@pytest.fixture
def cases_root(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake"}
    settings.ALLOWED_HOSTS = ["localhost"]  # schemathesis's WSGI client sends Host: localhost
    return settings.GRIDGATE_CASES_ROOT


@pytest.fixture(autouse=True)
def webhooks(settings, monkeypatch):
    """A site that can seal webhook secrets (else a valid webhook is a documented 503, which the
    server-error check counts), and no real DNS for the URLs the fuzzer makes up."""
    from cryptography.fernet import Fernet

    from apps.core import outbound

    settings.GRIDGATE_CREDENTIALS_KEY = [Fernet.generate_key().decode()]
    monkeypatch.setattr(outbound, "_getaddrinfo", lambda host, port: ["93.184.216.34"])
