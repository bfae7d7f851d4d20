"""``manage.py ticker``: the tick loop of one worker cluster (``apps.core.ticker``). Started by
``manage.py worker`` beside the cluster; run it by hand only to debug the passes."""

import signal
import threading

from django.core.management.base import BaseCommand

from apps.core.ticker import Ticker


class Command(BaseCommand):
    help = "Run the periodic passes while this process holds the tick lease, and beat the worker heartbeat."

    def handle(self, *args, **options):
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
        Ticker().run(stop)
