"""The connections pages' routes, added to the ``web`` namespace by ``apps/web/urls.py``."""

from django.urls import path

from apps.credentials import views as connections

urlpatterns = [
    path("connections/", connections.connection_list, name="connection-list"),
    path("connections/callback/", connections.connection_callback, name="connection-callback"),
    path("connections/<int:pool>/connect/", connections.connection_connect, name="connection-connect"),
    path("connections/<int:pool>/credential/", connections.connection_paste, name="connection-paste"),
    path("connections/<int:pool>/disconnect/", connections.connection_disconnect, name="connection-disconnect"),
]
