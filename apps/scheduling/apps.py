from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    label = "scheduling"
    verbose_name = "Devices, jobs and scheduling"

    def ready(self):
        from apps.scheduling import services
        from apps.sessions import hooks

        hooks.register_busy_condition(services.busy_condition)
        hooks.sessions_revoked.connect(services.on_sessions_revoked, dispatch_uid="scheduling.cancel_jobs")
