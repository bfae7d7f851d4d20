from django.apps import AppConfig


class QrmiConfig(AppConfig):
    name = "apps.qrmi"
    verbose_name = "QRMI / MUNGE"

    def ready(self):
        from apps.qrmi import schema  # noqa: F401 - registers the OpenAPI authentication extension
