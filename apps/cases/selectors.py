"""Read queries for cases and campaigns shared by the API and the admin."""

from apps.cases.models import Campaign, Case


def cases_for(user):
    """Own cases; staff see all (R: another user's case is 404, not 403)."""
    queryset = Case.objects.select_related("owner", "resource_class__pool")
    if not user.is_staff:
        queryset = queryset.filter(owner=user)
    return queryset.order_by("-created_at", "id")


def campaigns_for(user):
    queryset = Campaign.objects.select_related("owner")
    if not user.is_staff:
        queryset = queryset.filter(owner=user)
    return queryset.order_by("-created_at", "id")
