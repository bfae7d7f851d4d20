from django.urls import path

from apps.backends.api.views import BackendListView, LaunchOptionsView

urlpatterns = [
    path("backends/", BackendListView.as_view(), name="backend-list"),
    # Lives here rather than in the resources router: the options come from the backend.
    path("resource-classes/<int:pk>/launch-options/", LaunchOptionsView.as_view(), name="resourceclass-launch-options"),
]
