"""With server-side binding every value is a statement parameter, and PostgreSQL takes at most 65
535; the backend declares it so that Django batches what it builds."""

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from apps.sessions.models import Session, SessionStatus

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

MORE_THAN_A_STATEMENT_TAKES = 70_000


def test_postgres_batches_stay_within_the_protocol_parameter_limit():
    assert connection.features.max_query_params == 65_535
    assert connection.ops.bulk_batch_size(["session"], range(100_000)) == 65_535
    assert connection.ops.bulk_batch_size(["a", "b", "c"], range(100_000)) == 21_845
    assert connection.ops.bulk_batch_size([], range(10)) == 10


def many_sessions(pool, user, *, at, revoked: bool) -> None:
    """``MORE_THAN_A_STATEMENT_TAKES`` sessions of ``user`` in ``pool``, every time field ``at``:
    revoked (released) or still active, in one statement."""
    klass = pool.classes.get()
    status, reason = (SessionStatus.REVOKED, "released") if revoked else (SessionStatus.ACTIVE, "")
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Session._meta.db_table} (id, user_id, resource_class_id, pool_id, slots, external_id,"  # noqa: S608
            " status, created_at, last_activity_at, expires_at, idle_expires_at, revoked_at, revocation_reason,"
            " vruntime, launch_spec, cpu, memory, gpu, reserved_slots)"
            " SELECT gen_random_uuid(), %s, %s, %s, 1, '', %s, %s, %s, %s, %s, %s, %s, 0, '{}', 1, 1, 0, 0"
            " FROM generate_series(1, %s)",
            [user.pk, klass.pk, pool.pk, status, *[at] * 4, at if revoked else None, reason]
            + [MORE_THAN_A_STATEMENT_TAKES],
        )
        # The table's statistics as they are now. Left from a moment it was empty (an earlier test's
        # rows rolled back, then autovacuum), they made the deferred foreign-key checks of deleting
        # these sessions look each id up through sessions_created, where it is not the leading
        # column: a scan of all 70 000 entries per session, 200-240 s of the test's teardown.
        cursor.execute(f"ANALYZE {Session._meta.db_table}")


def test_cleanup_deletes_more_ended_sessions_than_one_statement_has_parameters(owner, local_pool):
    """Deleting sessions cascades to their jobs in ``IN`` lists of session ids: one list of
    70 000 failed ("number of parameters must be between 0 and 65535"), and the daily cleanup
    never got past it."""
    many_sessions(local_pool, owner, at=timezone.now() - timedelta(days=99), revoked=True)
    call_command("cleanup", "--days", "30", stdout=io.StringIO())
    assert not Session.objects.exists()


def test_an_expiry_sweep_revokes_more_due_sessions_than_one_statement_has_parameters(owner, local_pool):
    """R-SESS-3 after a long outage: the sweep names the sessions it revokes in IN lists; 70 000
    at once failed, and then every later sweep did too."""
    from apps.sessions.services import expire_due_sessions

    many_sessions(local_pool, owner, at=timezone.now() - timedelta(days=1), revoked=False)
    counts = expire_due_sessions()
    assert sum(counts.values()) == MORE_THAN_A_STATEMENT_TAKES
    assert not Session.objects.filter(status=SessionStatus.ACTIVE).exists()
