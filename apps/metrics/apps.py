from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "apps.metrics"
    label = "gridgate_metrics"
    verbose_name = "Metrics"
