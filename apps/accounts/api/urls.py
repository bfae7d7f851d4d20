from django.urls import path

from apps.accounts.api.views import TokenView

urlpatterns = [
    path("auth/token/", TokenView.as_view(), name="auth-token"),
]
