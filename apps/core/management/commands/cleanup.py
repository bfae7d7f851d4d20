"""``manage.py cleanup``: prune what has served its purpose (SPEC §8). Safe to re-run."""

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from apps.core.deletion import delete_in_batches
from apps.core.idempotency import IDEMPOTENCY_RETENTION
from apps.core.models import IdempotencyKey

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Delete ended sessions, finished jobs, case events, notification deliveries and login records older than the "
        "retention, idempotency keys older than 24 h and expired API tokens; purge the provider side "
        "(Qarnot buckets, FirecREST and Slurm run directories) of cases finished before the retention. "
        "Active work is never touched."
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
        from axes.models import AccessLog

        from apps.accounts.models import ApiToken, LoginRate
        from apps.cases.models import TERMINAL as CASE_TERMINAL
        from apps.cases.models import CaseEvent
        from apps.notifications.models import Delivery, DeliveryStatus
        from apps.scheduling.models import TERMINAL as JOB_TERMINAL
        from apps.scheduling.models import UNFINISHED, DriverRun, Job
        from apps.sessions.models import Session, SessionStatus

        if days < 1:
            self.stderr.write("--days must be at least 1")
            return
        now = timezone.now()
        try:
            cutoff = now - timedelta(days=days)
        except OverflowError:
            # A retention longer than the calendar ("keep everything"): nothing ended before it.
            cutoff = datetime.min.replace(tzinfo=UTC)
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
            # The notifications' log (R-NOTE-1): a pending delivery is still to be sent, whatever its age.
            (
                "sent or failed notifications",
                Delivery.objects.filter(created_at__lt=cutoff).exclude(status=DeliveryStatus.PENDING),
            ),
            # An expired token no longer authenticates (each login issues a new one).
            ("expired API tokens", ApiToken.objects.filter(expires_at__lte=now)),
            # django-axes writes one per successful page login; its failure counts expire by themselves.
            ("login records", AccessLog.objects.filter(attempt_time__lt=cutoff)),
            # The rate per address counts within a minute: older windows mean nothing.
            ("login rate windows", LoginRate.objects.filter(window_start__lt=now - timedelta(hours=1))),
        ]
        for label, queryset in targets:
            if dry_run:
                self.stdout.write(f"would delete {queryset.count()} {label}")
                continue
            self.stdout.write(f"deleted {delete_in_batches(queryset)} row(s): {label}")
        self.purge_remote(cutoff, dry_run)

    def purge_remote(self, cutoff, dry_run: bool) -> None:
        """SPEC §8: what finished cases left at the provider goes once they are past the
        retention. Each case is purged once (``remote_purged_at``); a provider error leaves it
        for the next run, and the other cases go on. The local workspace stays (results)."""
        from apps.backends.registry import get_backend
        from apps.backends.remote_common import scrub_for_pool
        from apps.cases.models import TERMINAL as CASE_TERMINAL
        from apps.cases.models import Case
        from apps.cases.passes import job_ref

        due = (
            Case.objects.filter(
                status__in=CASE_TERMINAL,
                finished_at__lt=cutoff,
                remote_purged_at__isnull=True,
                launch_requested_at__isnull=False,  # never launched: nothing was sent anywhere
            )
            .exclude(backend="")
            .select_related("resource_class__pool")
            .order_by("finished_at", "id")
        )
        if dry_run:
            self.stdout.write(f"would purge the remote side of {due.count()} finished case(s)")
            return
        purged = failed = 0
        for case in due.iterator(chunk_size=200):
            try:
                get_backend(case.backend).purge(job_ref(case))  # no transaction open
            except Exception as exc:  # one provider's refusal must not stop the others
                failed += 1
                text = scrub_for_pool(case.resource_class.pool, f"{type(exc).__name__}: {exc}")
                logger.warning("case %s: remote side not purged: %s", case.id, text)
                self.stderr.write(f"case {case.id}: remote side not purged (retried next run): {text}")
                continue
            purged += Case.objects.filter(pk=case.pk, remote_purged_at__isnull=True).update(
                remote_purged_at=timezone.now()
            )
        tail = f", {failed} failed" if failed else ""
        self.stdout.write(f"purged the remote side of {purged} finished case(s){tail}")
