"""``manage.py worker``: the django-q2 cluster (``qcluster``) and this worker's ticker process
(``manage.py ticker``, the tick loop and the worker heartbeat) under a supervisor that guarantees
a stop within ``GRIDGATE_STOP_GRACE`` seconds and stops both when either dies
(``apps.core.supervise``)."""

import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.core.supervise import supervise


class Command(BaseCommand):
    help = (
        "Run the background worker (django-q2 qcluster and the ticker process); SIGTERM or Ctrl-C "
        "stops it within the grace period."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--grace",
            type=float,
            default=settings.GRIDGATE_STOP_GRACE,
            help="Seconds a stop request waits for the cluster before killing it (default GRIDGATE_STOP_GRACE).",
        )

    def handle(self, *args, grace, **options):
        manage = str(settings.BASE_DIR / "manage.py")
        sys.exit(supervise([sys.executable, manage, "qcluster"], [sys.executable, manage, "ticker"], grace=grace))
