from django.apps import AppConfig


class ComputeSessionsConfig(AppConfig):
    name = "apps.sessions"
    # Must differ from django.contrib.sessions' label "sessions".
    label = "compute_sessions"
    verbose_name = "Compute sessions"

    def ready(self):
        from apps.sessions import receivers

        receivers.connect()
