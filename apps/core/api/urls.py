from django.urls import path

from apps.core.api.views import HealthView, TokenView

urlpatterns = [
    path("auth/token/", TokenView.as_view(), name="auth-token"),
    path("health/", HealthView.as_view(), name="health"),
]
