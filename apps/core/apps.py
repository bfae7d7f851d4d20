from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Gridgate core"

    def ready(self):
        from django.conf import settings

        from apps.core import tasks, ticker

        # Issue 17: every worker host heartbeats for itself (the minutely schedule reaches one
        # cluster a minute), writing its marker under the cases root (``manage.py doctor``), six
        # times per GRIDGATE_WORKER_STALE_SECONDS so a live host never looks stale.
        ticker.register(
            "core.heartbeat",
            tasks.heartbeat,
            every=lambda: max(1.0, settings.GRIDGATE_WORKER_STALE_SECONDS / 6),
            per_host=True,
        )
