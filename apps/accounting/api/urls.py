from django.urls import path

from apps.accounting.api.views import AccountingView

urlpatterns = [path("accounting/", AccountingView.as_view(), name="accounting")]
