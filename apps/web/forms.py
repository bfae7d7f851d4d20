"""Forms of the user pages: they parse input only; the rules live in the models and services."""

import json
from datetime import UTC, datetime, time, timedelta

from django import forms
from django.utils import timezone

from apps.accounts.models import ApiToken
from apps.core import jsonlimits
from apps.notifications.models import Channel, Event
from apps.web.selectors import case_classes

# The database's integer range: a larger number typed in a form is a form error, not a 500
# ("integer out of range").
MAX_INT = 2**31 - 1
MAX_BIGINT = 2**63 - 1


class OpenSessionForm(forms.Form):
    resource_class = forms.IntegerField(widget=forms.HiddenInput, min_value=1, max_value=MAX_BIGINT)
    slots = forms.IntegerField(min_value=1, max_value=MAX_INT, initial=1)
    external_id = forms.CharField(max_length=128, required=False, label="External id (optional)")


class JobSubmitForm(forms.Form):
    """A Pulser sequence from an uploaded JSON file or a bundled example, and the shots."""

    example = forms.ChoiceField(required=False, label="Bundled example")
    sequence_file = forms.FileField(required=False, label="Or upload a sequence (JSON)")
    shots = forms.IntegerField(min_value=1, max_value=100_000, initial=100)

    def __init__(self, *args, examples: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.examples = examples
        self.detail = ""  # the parser's own words, shown to experts only
        self.fields["example"].choices = [("", "—")] + [(name, name) for name in examples]

    def clean(self):
        data = super().clean()
        upload, example = data.get("sequence_file"), data.get("example")
        if upload:
            try:
                text = upload.read().decode("utf-8")
            except UnicodeDecodeError as exc:
                self.detail = str(exc)
                raise forms.ValidationError(
                    {"sequence_file": "The file is not a text file. Upload the sequence saved as JSON."}
                ) from None
            try:
                document = jsonlimits.loads(text)  # too deep: a ValueError
            except (ValueError, RecursionError) as exc:
                self.detail = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
                raise forms.ValidationError(
                    {
                        "sequence_file": "The file is not valid JSON. Save the sequence as JSON (for example with "
                        "Pulser's sequence.to_abstract_repr()) and upload it again."
                    }
                ) from None
        elif example:
            document = self.examples[example]
        else:
            raise forms.ValidationError("Pick a bundled example or upload a sequence file.")
        data["payload"] = payload_of(document)
        return data


def payload_of(document):
    """Accept what people have at hand: an example file (``{"payload", "shots"}``), a job payload
    (``{"sequence": …}``) or a bare Pulser abstract representation."""
    if isinstance(document, dict) and isinstance(document.get("payload"), dict):
        return document["payload"]
    if isinstance(document, dict) and "sequence" in document:
        return document
    return {"sequence": json.dumps(document)}


class TokenCreateForm(forms.Form):
    """A personal API token's name and term. The term's bounds are the service's
    (``accounts.services.issue_token``); the page shows them and the browser checks them first."""

    name = forms.CharField(
        max_length=ApiToken._meta.get_field("name").max_length,
        help_text="What the token is for: a host, a script, a tool.",
    )
    expires_in_days = forms.IntegerField(min_value=1, max_value=MAX_INT, label="Expires in (days)")

    def __init__(self, *args, default_days: int, max_days: int, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields["expires_in_days"]
        field.initial = default_days
        field.widget.attrs["max"] = max_days
        field.help_text = f"{default_days} unless you choose otherwise; at most {max_days}."


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("widget", MultipleFileInput())
        super().__init__(*args, **kwargs)

    def clean(self, data, initial=None):
        single = super().clean
        if isinstance(data, (list, tuple)):
            return [single(item, initial) for item in data]
        return [single(data, initial)] if data else []


class CaseCreateForm(forms.Form):
    name = forms.CharField(max_length=200)
    resource_class = forms.ModelChoiceField(queryset=None, label="Class")
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), help_text="Run in the case's working directory."
    )
    observability_globs = forms.CharField(
        required=False,
        label="Files to watch while it runs",
        help_text="Glob patterns, one per line or comma-separated (e.g. logs/*.txt).",
    )
    inputs = MultipleFileField(required=False, label="Input files")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["resource_class"].queryset = case_classes(user)

    def clean_observability_globs(self):
        raw = self.cleaned_data.get("observability_globs") or ""
        return [part.strip() for part in raw.replace(",", "\n").splitlines() if part.strip()]


class UtilizationForm(forms.Form):
    """The period (and pool) of the operators' charts. Everything a hostile query string can put
    here ends as a form error: unknown periods, impossible or far dates, a reversed or too long
    range, a pool that does not exist."""

    PRESETS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
    period = forms.ChoiceField(
        choices=[
            ("24h", "Last 24 hours"),
            ("7d", "Last 7 days"),
            ("30d", "Last 30 days"),
            ("custom", "From–to dates"),
        ],
        initial="24h",
        required=False,
        label="Period",
    )
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To (included)", widget=forms.DateInput(attrs={"type": "date"}))
    pool = forms.ModelChoiceField(queryset=None, required=False, empty_label="All pools", label="Pool")

    def __init__(self, *args, **kwargs):
        from apps.resources.models import ResourcePool

        super().__init__(*args, **kwargs)
        self.fields["pool"].queryset = ResourcePool.objects.order_by("name", "id")

    def clean(self):
        from apps.accounting.selectors import EARLIEST, LATEST, MAX_PERIOD

        data = super().clean()
        period = data.get("period") or "24h"
        if period in self.PRESETS:
            data["end"] = timezone.now().replace(microsecond=0)
            data["start"] = data["end"] - self.PRESETS[period]
            return data
        since, until = data.get("since"), data.get("until")
        if "since" in self.errors or "until" in self.errors:
            return data
        if since is None or until is None:
            raise forms.ValidationError(
                "Give both dates (From and To), or pick one of the last-24-hours/7/30-days periods."
            )
        for name, day in (("since", since), ("until", until)):
            if not EARLIEST.date() <= day < LATEST.date():
                self.add_error(name, f"Pick a date between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}.")
        if self.errors:
            return data
        if since > until:
            raise forms.ValidationError("The From date must be on or before the To date.")
        start = datetime.combine(since, time.min, tzinfo=UTC)
        end = datetime.combine(until, time.min, tzinfo=UTC) + timedelta(days=1)
        if end - start > MAX_PERIOD:
            raise forms.ValidationError(f"Pick at most {MAX_PERIOD.days} days.")
        data["start"], data["end"] = start, end
        return data


class SubscriptionForm(forms.Form):
    """A notification subscription (R-NOTE-1): the rules are the service's (the URL's outbound
    check, e-mail needing an address on the account)."""

    event = forms.ChoiceField(choices=Event.choices)
    channel = forms.ChoiceField(
        choices=Channel.choices,
        help_text="E-mail goes to the address of your account; a webhook to the URL below.",
    )
    url = forms.CharField(
        label="Webhook URL",
        required=False,
        max_length=2000,
        help_text="https, on a public address; leave empty for e-mail.",
    )
