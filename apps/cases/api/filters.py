import django_filters

from apps.cases.models import Campaign, Case, CaseStatus
from apps.cases.selectors import campaigns_for
from apps.resources.api.filters import visible_class_choices


def own_campaigns(request):
    """The campaigns the caller sees (own; staff all): checked against every campaign, another
    user's id gave an empty list where a missing one gave a 400, which confirmed it."""
    if request is None:
        return Campaign.objects.none()
    return campaigns_for(request.user)


class CaseFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=CaseStatus.choices)
    campaign = django_filters.ModelChoiceFilter(queryset=own_campaigns)
    resource_class = django_filters.ModelChoiceFilter(queryset=visible_class_choices)

    class Meta:
        model = Case
        fields = ["status", "campaign", "resource_class", "backend"]
