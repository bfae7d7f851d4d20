"""R-QRMI-1: no trailing slashes (the client builds these exact paths; an APPEND_SLASH redirect
would turn its POST/DELETE into a failing GET). Mounted at ``qrmi/<pool>/`` in config/urls.py."""

from django.urls import path

from apps.qrmi.api import views

app_name = "qrmi"

urlpatterns = [
    path("", views.RootView.as_view(), name="root"),
    path("accessible", views.AccessibleView.as_view(), name="accessible"),
    path("status", views.StatusView.as_view(), name="status"),
    path("sessions", views.SessionsView.as_view(), name="sessions"),
    path("sessions/<str:session_id>", views.SessionView.as_view(), name="session"),
    path("jobs", views.JobsView.as_view(), name="jobs"),
    path("jobs/<int:job_id>", views.JobView.as_view(), name="job"),
    path("jobs/<int:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/logs", views.JobLogsView.as_view(), name="job-logs"),
    path("qpu/specs", views.SpecsView.as_view(), name="specs"),
    path("qpu-slots", views.SlotsView.as_view(), name="slots"),
]
