from django.apps import AppConfig


class BackendsConfig(AppConfig):
    name = "apps.backends"
    label = "backends"
    verbose_name = "Execution backends"
