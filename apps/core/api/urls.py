from django.urls import path

from apps.core.api.views import HealthView, LoginMethodsView

urlpatterns = [
    path("health/", HealthView.as_view(), name="health"),
    path("auth/methods/", LoginMethodsView.as_view(), name="login-methods"),
]
