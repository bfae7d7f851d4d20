import os

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test.utils import override_settings
from rest_framework.test import APIClient

from tests import factories


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing():
    """Users are made and logged in with few PBKDF2 iterations (``tests/passwords.py``)."""
    with override_settings(PASSWORD_HASHERS=["tests.passwords.FastPBKDF2PasswordHasher", *settings.PASSWORD_HASHERS]):
        yield


@pytest.fixture(autouse=True)
def _fresh_queue_snapshots():
    """Each test reads its pools' queues afresh: the ETA's per-process cache (snapshots, the arrival
    figures they keep for a minute, corrections) is keyed by pool id, which SQLite reuses after a rollback."""
    from apps.scheduling import eta

    eta.clear_cache()


@pytest.hookimpl(trylast=True)  # after -m has deselected: only the tests that will run count
def pytest_collection_modifyitems(config, items):
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    selected = sum(1 for item in items if "postgres" in item.keywords)
    if os.environ.get("CI", "").lower() == "true" and selected:
        # CI's SQLite pass (.ci/run) deselects them with -m "not postgres"; anything else under CI
        # must run them, not skip them.
        raise pytest.UsageError(
            f"CI=true requires PostgreSQL: {selected} selected test(s) need it and must run, not be skipped. "
            "Set DATABASE_URL or start PostgreSQL on 127.0.0.1:5432 (or deselect them: -m 'not postgres')."
        )
    reason = os.environ.get("GRIDGATE_TEST_PG_SKIP_REASON", "needs PostgreSQL (SQLite ignores SELECT ... FOR UPDATE)")
    skip = pytest.mark.skip(reason=f"PostgreSQL-only test skipped: {reason}")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


User = get_user_model()


#: what an operator is granted to manage pools, classes and devices (staff alone is not)
OPERATOR_PERMISSIONS = [
    f"{action}_{model}"
    for action in ("add", "change", "delete")
    for model in ("resourcepool", "resourceclass", "device")
]


@pytest.fixture
def staff(db):
    """An operator: staff, with the pool, class and device permissions."""
    from django.contrib.auth.models import Permission

    user = factories.user("staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=OPERATOR_PERMISSIONS))
    return user


@pytest.fixture
def bare_staff(db):
    """Staff without any model permission."""
    return factories.user("bare-staff", is_staff=True)


@pytest.fixture
def owner(db):
    return factories.user("owner")


@pytest.fixture
def member(db):
    return factories.user("member")


@pytest.fixture
def outsider(db):
    return factories.user("outsider")


def client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def used_token_key(user, **kwargs) -> str:
    """The key of a new token of ``user`` already used this minute: a request with it costs the
    token lookup alone, like every request but a token's first in a minute (which also records
    ``last_used_at``: apps.accounts.services.note_use). For statement budgets of the common request."""
    from django.utils import timezone

    from apps.accounts.models import ApiToken
    from apps.accounts.services import issue_token

    token, key = issue_token(user, **kwargs)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return key


@pytest.fixture
def api():
    """``api(user)`` → an APIClient authenticated as ``user`` (None for anonymous)."""
    return client_for


@pytest.fixture
def local_pool(db):
    return factories.pool("local", default=True, class_name="small", memory=2)


@pytest.fixture
def private_pool(db, member):
    group = Group.objects.create(name="qpu-users")
    member.groups.add(group)
    pool = factories.pool("qpu", public=False, slots_total=10, class_name="qpu-access")
    pool.groups.add(group)
    return pool


FIRECREST_REMOTE = {
    "api_url": "https://firecrest.example.org/v2",
    "token_uri": "https://auth.example.org/token",
    "system_name": "daint",
}


@pytest.fixture
def firecrest_pool(db):
    return factories.pool(
        "alps",
        kind="firecrest",
        remote=dict(FIRECREST_REMOTE, partition="normal"),
        class_name="node",
        cpu=64,
        memory=256,
        gpu=4,
    )


@pytest.fixture
def service_principal(db):
    """An integration account (e.g. the SPANK plugin) holding ``act_on_behalf``."""
    from django.contrib.auth.models import Permission

    user = factories.user("spank")
    user.user_permissions.add(Permission.objects.get(codename="act_on_behalf"))
    return User.objects.get(pk=user.pk)  # fresh instance: permission cache


@pytest.fixture
def admin_client(client, staff):
    """The Django test client logged in as a superuser (shadows pytest-django's own)."""
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


@pytest.fixture
def open_session():
    """``open_session(pool, user, slots=1, **kwargs)`` → a session admitted on the pool's default class."""

    def make(pool, user, slots=1, **kwargs):
        return factories.session(pool, user, slots=slots, **kwargs)

    return make


_TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


@pytest.fixture
def statement_budget(django_assert_max_num_queries):
    """``with statement_budget(4): …`` fails if the block runs more than 4 SQL statements of work.

    SPEC §9's budgets count statements that read or write rows; Django 5.2 also logs a
    transaction's BEGIN and COMMIT as queries, so the outer limit leaves room for one transaction
    and the inner check counts the rest. On PostgreSQL the statements are also counted where they
    leave for the server (psycopg's cursors), so that none is hidden from Django's log (a
    connection health check's ping, a raw ``connection.execute``).
    """
    from contextlib import contextmanager, nullcontext
    from unittest import mock

    from django.db import connection

    @contextmanager
    def budget(statements: int):
        sent = []
        counting = nullcontext()
        if connection.vendor == "postgresql":
            import psycopg

            execute = psycopg.Cursor.execute

            def counted(cursor, query, *args, **kwargs):
                sent.append(query)
                return execute(cursor, query, *args, **kwargs)

            counting = mock.patch.object(psycopg.Cursor, "execute", counted)
        with counting, django_assert_max_num_queries(statements + 2) as context:
            yield context
        work = [q["sql"] for q in context.captured_queries if not q["sql"].startswith(_TRANSACTION_CONTROL)]
        assert len(work) <= statements, f"{len(work)} statements > {statements}:\n" + "\n".join(work)
        assert len(sent) <= statements, f"{len(sent)} statements sent > {statements}: {sent}"

    return budget


@pytest.fixture
def broker_down(monkeypatch):
    """django-q2's broker pointed at Redis on a closed loopback port (a broker outage, or
    GRIDGATE_REDIS_URL set wrong): every ``async_task`` fails to connect."""
    import socket

    from django_q.conf import Conf

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", f"redis://127.0.0.1:{port}/7")
    return port


@pytest.fixture(autouse=True)
def credentials_unbound_unless_asked(request, monkeypatch):
    """Pools' credential variables must be bound to them (``<NAME>_POOLS``, apps/core/credentials.py);
    the backend tests, which make their pools on the fly, read them as bound unless they test the
    binding itself (``@pytest.mark.credential_binding``)."""
    from apps.core import credentials

    if request.node.get_closest_marker("credential_binding") is None:
        monkeypatch.setattr(credentials, "BINDING_REQUIRED", False)


#: fixtures that open the test database: none of them in the unit tier
_DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback", "live_server"}
)


@pytest.fixture(autouse=True)
def _unit_tier_has_no_database(request):
    """The unit tier (``tests/<app>/unit/``) is pure logic: a test there that asks for the
    database is an error, and the database must be out of reach (pytest-django blocks it for
    every test without the ``django_db`` mark; this checks the block holds)."""
    if request.node.path.parent.name != "unit":
        return
    from django.db import connection

    asked = sorted(_DATABASE_FIXTURES & set(request.fixturenames))
    marked = request.node.get_closest_marker("django_db") is not None
    assert not asked and not marked, f"a unit test must not use the database (asked for {asked or 'django_db'})"
    with pytest.raises(RuntimeError, match="Database access not allowed"):
        connection.ensure_connection()
