from django.urls import path

from apps.backends.api.views import BackendListView, ConnectionDetailView, ConnectionListView, LaunchOptionsView

urlpatterns = [
    path("backends/", BackendListView.as_view(), name="backend-list"),
    # Lives here rather than in the resources router: the options come from the backend.
    path("resource-classes/<int:pk>/launch-options/", LaunchOptionsView.as_view(), name="resourceclass-launch-options"),
    # Per-user remote credentials: the caller's own connections, by pool (connecting is a browser flow).
    path("connections/", ConnectionListView.as_view(), name="connection-list"),
    path("connections/<int:pool>/", ConnectionDetailView.as_view(), name="connection-detail"),
]
