from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "apps.reservations"
    label = "reservations"
    verbose_name = "Calendar: reservations and maintenance"

    def ready(self):
        from django.conf import settings

        from apps.core import ticker
        from apps.reservations import passes, schema  # noqa: F401 - schema registers the feed token scheme

        # R-RES-1: holders find their reserved slots free at a window's start, within one tick.
        ticker.register("reservations.start", passes.start_windows, every=lambda: settings.GRIDGATE_DISPATCH_TICK)
