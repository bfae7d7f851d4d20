"""``manage.py worker``: the django-q2 cluster (``qcluster``) and this worker's ticker process
(``manage.py ticker``, the tick loop and the worker heartbeat) under a supervisor that guarantees
a stop within ``GRIDGATE_STOP_GRACE`` seconds, stops both when either dies, and takes both with it
when it is killed itself (``apps.core.supervise``). One worker per ``GRIDGATE_WORKER_HOST`` at a
time: it first waits for the host's lock and lease (``apps.core.worker_host``)."""

import signal
import sys
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.core.supervise import supervise
from apps.core.worker_host import HostClaim


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
        claim = HostClaim(say=lambda message: self.stderr.write(f"worker: {message}"))
        stop = threading.Event()
        previous = {
            sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            if not claim.wait(stop):  # stopped while waiting for the host: nothing was started
                claim.release()
                sys.exit(0)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        manage = str(settings.BASE_DIR / "manage.py")
        try:
            code = supervise(
                [sys.executable, manage, "qcluster"],
                [sys.executable, manage, "ticker"],
                grace=grace,
                keep_fds=() if claim.lock_fd is None else (claim.lock_fd,),
                stop_when=claim.lost,
            )
        finally:
            claim.release()
        sys.exit(code)
