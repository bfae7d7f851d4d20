from django.urls import re_path
from rest_framework.routers import DefaultRouter

from apps.cases.api.renderers import AnyMediaRenderer
from apps.cases.api.views import CampaignViewSet, CaseViewSet
from apps.core.api.renderers import JSONRenderer

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("cases", CaseViewSet, basename="case")
router.register("campaigns", CampaignViewSet, basename="campaign")

urlpatterns = router.urls + [
    # SPEC §7 pins /cases/{id}/files/{path} without a trailing slash, and the path may contain
    # slashes, so it is routed by hand after the router's /files/ listing. Any character, a
    # newline too: a command may name a file so, and "." would make its link a NoReverseMatch
    # (a 500 on the case page); ``\Z``, since ``$`` also matches before a final newline.
    re_path(
        r"^cases/(?P<pk>[0-9a-fA-F-]{36})/files/(?P<path>[\s\S]+)\Z",
        CaseViewSet.as_view({"get": "download"}, renderer_classes=[JSONRenderer, AnyMediaRenderer]),
        name="case-file",
    ),
]
