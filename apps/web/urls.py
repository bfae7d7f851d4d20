from django.urls import path

from apps.accounts import oidc
from apps.accounts.forms import LoginForm
from apps.credentials.urls import urlpatterns as connection_urlpatterns
from apps.web import notifications, views

app_name = "web"

urlpatterns = [
    path("", views.home, name="home"),
    path(
        "login/",
        views.LoginView.as_view(template_name="web/login.html", authentication_form=LoginForm),
        name="login",
    ),
    # Also at the identity provider for a browser signed in with it (RP-initiated logout).
    path("logout/", oidc.logout_view, name="logout"),
    path("pools/<int:pk>/", views.pool_detail, name="pool-detail"),
    path("sessions/", views.session_list, name="session-list"),
    path("sessions/open/", views.session_open, name="session-open"),
    path("sessions/<uuid:pk>/", views.session_detail, name="session-detail"),
    path("sessions/<uuid:pk>/release/", views.session_release, name="session-release"),
    path("sessions/<uuid:pk>/jobs/", views.job_submit, name="job-submit"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("cases/", views.case_list, name="case-list"),
    path("cases/<uuid:pk>/", views.case_detail, name="case-detail"),
    path("cases/<uuid:pk>/files/", views.case_files, name="case-files"),
    path("cases/<uuid:pk>/launch/", views.case_launch, name="case-launch"),
    path("cases/<uuid:pk>/cancel/", views.case_cancel, name="case-cancel"),
    path("cases/<uuid:pk>/refresh/", views.case_refresh, name="case-refresh"),
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("utilization/", views.utilization, name="utilization"),
    path("notifications/", notifications.notification_list, name="notification-list"),
    path("notifications/<int:pk>/delete/", notifications.notification_delete, name="notification-delete"),
]

# Per-user remote credentials (docs/backends.md, "Per-user credentials"): the connections pages.
urlpatterns += connection_urlpatterns
