"""``manage.py cleanup``: prune what has served its purpose (SPEC §8). Safe to re-run."""

from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from apps.core.idempotency import IDEMPOTENCY_RETENTION
from apps.core.models import IdempotencyKey


class Command(BaseCommand):
    help = (
        "Delete ended sessions, finished jobs and case events older than the retention, and "
        "idempotency keys older than 24 h. Active work is never touched."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--days",
            type=int,
            default=settings.GRIDGATE_RETENTION_DAYS,
            help="Retention in days (default GRIDGATE_RETENTION_DAYS, %(default)s).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")

    def handle(self, *args, days, dry_run, **options):
        from apps.cases.models import TERMINAL as CASE_TERMINAL
        from apps.cases.models import CaseEvent
        from apps.scheduling.models import TERMINAL as JOB_TERMINAL
        from apps.scheduling.models import UNFINISHED, DriverRun, Job
        from apps.sessions.models import Session, SessionStatus

        if days < 1:
            self.stderr.write("--days must be at least 1")
            return
        now = timezone.now()
        cutoff = now - timedelta(days=days)
        targets = [
            ("idempotency keys", IdempotencyKey.objects.filter(created_at__lt=now - IDEMPOTENCY_RETENTION)),
            ("finished jobs", Job.objects.filter(status__in=JOB_TERMINAL, finished_at__lt=cutoff)),
            (
                "driver runs of finished jobs",
                DriverRun.objects.filter(created_at__lt=cutoff).exclude(
                    remote_id__in=Job.objects.filter(status__in=UNFINISHED).values("remote_id")
                ),
            ),
            (
                "ended sessions",
                Session.objects.filter(status=SessionStatus.REVOKED, revoked_at__lt=cutoff).exclude(
                    jobs__status__in=UNFINISHED
                ),
            ),
            ("events of finished cases", CaseEvent.objects.filter(at__lt=cutoff, case__status__in=CASE_TERMINAL)),
        ]
        for label, queryset in targets:
            if dry_run:
                self.stdout.write(f"would delete {queryset.count()} {label}")
                continue
            with transaction.atomic():
                deleted, _ = queryset.delete()
            self.stdout.write(f"deleted {deleted} row(s): {label}")
