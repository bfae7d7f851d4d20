"""manage.py cleanup prunes old ended things and never touches active work."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.core.models import IdempotencyKey
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Job, JobStatus
from apps.sessions import services
from apps.sessions.models import Session

pytestmark = pytest.mark.django_db


def test_cleanup_prunes_old_ended_sessions_jobs_and_keys_only(owner, capsys):
    pool = ResourcePool.objects.create(name="p", public=True)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    old_ended = services.admit(user=owner, resource_class=klass).session
    services.release(user=old_ended.user, session_id=old_ended.pk)
    kept_active = services.admit(user=owner, resource_class=klass).session
    long_ago = timezone.now() - timedelta(days=200)
    Session.objects.filter(pk=old_ended.pk).update(revoked_at=long_ago)
    now = timezone.now()
    finished = Job.objects.create(
        session=kept_active,
        pool=pool,
        user=owner,
        payload={},
        shots=1,
        created_at=now,
        status=JobStatus.COMPLETED,
        finished_at=long_ago,
    )
    pending = Job.objects.create(session=kept_active, pool=pool, user=owner, payload={}, shots=1, created_at=long_ago)
    old_key = IdempotencyKey.objects.create(user=owner, key="old", fingerprint="x")
    IdempotencyKey.objects.filter(pk=old_key.pk).update(created_at=now - timedelta(hours=25))
    fresh_key = IdempotencyKey.objects.create(user=owner, key="fresh", fingerprint="y")

    call_command("cleanup", "--dry-run")
    assert Session.objects.filter(pk=old_ended.pk).exists()
    call_command("cleanup", "--days", "30")
    call_command("cleanup", "--days", "30")  # safe to re-run

    assert not Session.objects.filter(pk=old_ended.pk).exists()
    assert Session.objects.filter(pk=kept_active.pk).exists()
    assert not Job.objects.filter(pk=finished.pk).exists() and Job.objects.filter(pk=pending.pk).exists()
    assert list(IdempotencyKey.objects.values_list("pk", flat=True)) == [fresh_key.pk]
    out = capsys.readouterr().out
    assert "would delete 1 ended sessions" in out and "deleted 1 row(s): idempotency keys" in out


def test_cleanup_deletes_expired_api_tokens_and_says_how_many(owner, capsys):
    from apps.accounts.models import ApiToken
    from apps.accounts.services import issue_token

    expired, _ = issue_token(owner)
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    valid, _ = issue_token(owner)
    call_command("cleanup")
    assert "deleted 1 row(s): expired API tokens" in capsys.readouterr().out
    assert list(ApiToken.objects.values_list("pk", flat=True)) == [valid.pk]


@pytest.mark.parametrize("days", [1_000_000, 10**12])
def test_a_retention_longer_than_the_calendar_keeps_everything_instead_of_failing(owner, capsys, settings, days):
    """``--days 1000000`` (or GRIDGATE_RETENTION_DAYS set so, "keep everything") put the cutoff
    before year 1: OverflowError, and the daily cleanup failed every day, expired tokens and old
    idempotency keys included."""
    pool = ResourcePool.objects.create(name="p", public=True)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    ended = services.admit(user=owner, resource_class=klass).session
    services.release(user=ended.user, session_id=ended.pk)
    Session.objects.filter(pk=ended.pk).update(revoked_at=timezone.now() - timedelta(days=3650))
    old_key = IdempotencyKey.objects.create(user=owner, key="old", fingerprint="x")
    IdempotencyKey.objects.filter(pk=old_key.pk).update(created_at=timezone.now() - timedelta(hours=25))
    settings.GRIDGATE_RETENTION_DAYS = days
    call_command("cleanup")
    call_command("cleanup", days=days)
    assert Session.objects.filter(pk=ended.pk).exists()  # within the retention
    assert not IdempotencyKey.objects.filter(pk=old_key.pk).exists()  # kept 24 h whatever the retention


@pytest.mark.postgres
def test_a_backlog_of_more_finished_jobs_than_a_statement_takes_parameters_is_deleted(owner, capsys):
    """A job's deletion clears the charges that name it (SET NULL), which Django wrote as one
    statement naming every job deleted: past PostgreSQL's 65 535 parameters, cleanup failed, and
    with it everything after the jobs (sessions, deliveries, tokens), at every run."""
    pool = ResourcePool.objects.create(name="p", public=True)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    session = services.admit(user=owner, resource_class=klass).session
    long_ago = timezone.now() - timedelta(days=200)
    finished = {"status": JobStatus.COMPLETED, "finished_at": long_ago, "created_at": long_ago}
    backlog = 66_000
    Job.objects.bulk_create(
        (Job(session=session, pool=pool, user=owner, payload={}, shots=1, **finished) for _ in range(backlog)),
        batch_size=5_000,
    )
    old_key = IdempotencyKey.objects.create(user=owner, key="old", fingerprint="x")
    IdempotencyKey.objects.filter(pk=old_key.pk).update(created_at=timezone.now() - timedelta(hours=25))

    call_command("cleanup", "--days", "30")

    assert not Job.objects.exists() and not IdempotencyKey.objects.exists()
    assert f"deleted {backlog} row(s): finished jobs" in capsys.readouterr().out
