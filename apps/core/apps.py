from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Gridgate core"

    def ready(self):
        # A process `manage.py worker` started (the cluster, the ticker) ends with its supervisor,
        # however the supervisor died (apps.core.supervise, "The lifeline"); elsewhere a no-op.
        from apps.core.supervise import watch_lifeline

        watch_lifeline()
