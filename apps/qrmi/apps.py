from django.apps import AppConfig


class QrmiConfig(AppConfig):
    name = "apps.qrmi"
    verbose_name = "QRMI / MUNGE"
