from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    label = "scheduling"
    verbose_name = "Devices, jobs and scheduling"

    def ready(self):
        from django.conf import settings

        from apps.core import ticker
        from apps.scheduling import device_status, passes, services
        from apps.scheduling.drivers import emulator, pasqal_cloud
        from apps.sessions import hooks

        # R-SCHED-5 safety net: poll and dispatch every pool with unfinished jobs every second.
        ticker.register("scheduling.sweep", passes.sweep, every=lambda: settings.GRIDGATE_DISPATCH_TICK)
        # Emulator runs whose worker died are re-run, lost tasks re-sent (every beat).
        ticker.register(
            "scheduling.emulator_recovery",
            emulator.recover_runs,
            every=lambda: settings.GRIDGATE_EMULATOR_HEARTBEAT_SECONDS,
        )
        # Real QPUs: ask each provider whether its device is operational (a task per device).
        ticker.register(
            "scheduling.device_status",
            device_status.enqueue_checks,
            every=lambda: settings.GRIDGATE_DEVICE_STATUS_INTERVAL,
        )
        # The repair behind the revocation's announcement: jobs of sessions that ended unfinished.
        ticker.register("scheduling.ended_sessions", services.cancel_jobs_of_ended_sessions, every=lambda: 60)
        # Pasqal Cloud batches left open for sessions that ended are closed (a task when any).
        ticker.register("scheduling.open_batches", pasqal_cloud.enqueue_batch_closes, every=lambda: 5)
        hooks.register_busy_condition(services.busy_condition)
        hooks.sessions_revoked.connect(services.on_sessions_revoked, dispatch_uid="scheduling.cancel_jobs")
