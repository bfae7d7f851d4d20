"""``manage.py worker``: the django-q2 cluster (``qcluster``) under a supervisor that guarantees
a stop within ``GRIDGATE_STOP_GRACE`` seconds (see ``apps.core.supervise``), and this host's own
loop (``apps.core.ticker.host_loop``: its heartbeat and the cases pinned to it, issue 17) in a
thread of the supervisor, which ends with it."""

import sys
import threading

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
        from apps.core import ticker

        stop = threading.Event()
        threading.Thread(target=ticker.host_loop, args=(stop,), name="host-loop", daemon=True).start()
        manage = settings.BASE_DIR / "manage.py"
        try:
            code = supervise([sys.executable, str(manage), "qcluster"], grace)
        finally:
            stop.set()  # a loop in its lease-holding step ends with the process (daemon thread)
        sys.exit(code)
