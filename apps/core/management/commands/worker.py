"""``manage.py worker``: the django-q2 cluster (``qcluster``) under a supervisor that guarantees
a stop within ``GRIDGATE_STOP_GRACE`` seconds (see ``apps.core.supervise``)."""

import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.core.supervise import supervise


class Command(BaseCommand):
    help = "Run the background worker (django-q2 qcluster); SIGTERM or Ctrl-C stops it within the grace period."

    def add_arguments(self, parser):
        parser.add_argument(
            "--grace",
            type=float,
            default=settings.GRIDGATE_STOP_GRACE,
            help="Seconds a stop request waits for the cluster before killing it (default GRIDGATE_STOP_GRACE).",
        )

    def handle(self, *args, grace, **options):
        manage = settings.BASE_DIR / "manage.py"
        sys.exit(supervise([sys.executable, str(manage), "qcluster"], grace))
