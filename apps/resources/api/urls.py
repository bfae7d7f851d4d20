from rest_framework.routers import DefaultRouter

from apps.resources.api.views import ResourceClassViewSet, ResourcePoolViewSet

router = DefaultRouter()
router.register("resource-pools", ResourcePoolViewSet, basename="resourcepool")
router.register("resource-classes", ResourceClassViewSet, basename="resourceclass")

urlpatterns = router.urls
