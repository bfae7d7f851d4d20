from django.apps import AppConfig


class WebConfig(AppConfig):
    """The user pages: server-rendered templates with htmx fragments for live updates."""

    name = "apps.web"
    label = "web"
    verbose_name = "User pages"
