from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "apps.notifications"
    label = "notifications"
    verbose_name = "Notifications"

    def ready(self):
        from django.conf import settings

        from apps.core import ticker
        from apps.notifications import passes

        # R-NOTE-1: deliveries leave off the request path, from the tick loop.
        ticker.register("notifications.deliver", passes.deliver_due, every=lambda: settings.GRIDGATE_NOTIFY_TICK)
        # Sessions about to reach their lifetime: their owners hear it (one look every 30 s).
        ticker.register("notifications.sessions_expiring", passes.sessions_expiring, every=lambda: 30)
