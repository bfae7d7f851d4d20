from django.apps import AppConfig


class CasesConfig(AppConfig):
    name = "apps.cases"
    label = "cases"
    verbose_name = "Cases"

    def ready(self):
        from django.conf import settings

        from apps.cases import tasks
        from apps.core import ticker

        # R-CASE-2: the submit/poll/sync passes every few seconds, between event-triggered polls.
        ticker.register("cases.passes", tasks.run_passes, every=lambda: settings.GRIDGATE_CASE_TICK_INTERVAL)
        # The cases pinned to this host (local processes), in every host's own loop.
        ticker.register(
            "cases.host_passes",
            tasks.run_host_passes,
            every=lambda: settings.GRIDGATE_CASE_TICK_INTERVAL,
            per_host=True,
        )
