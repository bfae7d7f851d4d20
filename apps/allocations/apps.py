from django.apps import AppConfig


class AllocationsConfig(AppConfig):
    name = "apps.allocations"
    label = "allocations"
    verbose_name = "Allocations and usage charges"
