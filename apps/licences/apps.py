from django.apps import AppConfig


class LicencesConfig(AppConfig):
    name = "apps.licences"
    verbose_name = "Slurm licences"

    def ready(self):
        from django.conf import settings
        from django.db.models.signals import post_save, pre_delete

        from apps.core import ticker
        from apps.licences import passes, services
        from apps.resources.models import ResourcePool
        from apps.scheduling.models import Device
        from apps.sessions import hooks

        # What Slurm may hand out changes with the non-batch sessions (the sessions app says
        # when), the pool's capacity and accessibility, and its devices: sync within seconds.
        hooks.batch_capacity_changed.connect(services.on_batch_capacity_changed, dispatch_uid="licences.sessions")
        post_save.connect(services.on_pool_saved, sender=ResourcePool, dispatch_uid="licences.pool")
        post_save.connect(services.on_device_saved, sender=Device, dispatch_uid="licences.device")
        pre_delete.connect(services.on_pool_deleted, sender=ResourcePool, dispatch_uid="licences.pool_deleted")
        # The safety net: every licence compared with what Slurm holds, drift repaired.
        ticker.register(
            "licences.reconcile", passes.reconcile, every=lambda: settings.GRIDGATE_LICENCE_RECONCILE_SECONDS
        )
