from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.accounts.api.views import ApiTokenViewSet, TokenView

router = SimpleRouter()
router.register("auth/tokens", ApiTokenViewSet, basename="apitoken")

urlpatterns = [
    path("auth/token/", TokenView.as_view(), name="auth-token"),
    *router.urls,
]
