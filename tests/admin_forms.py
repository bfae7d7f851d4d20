"""Builds the POST an operator's browser sends from an admin change page as it was rendered
(the main form and every inline's forms, with their current values), for tests that then edit
one or two values."""

from django import forms


def _add(data: dict, form) -> None:
    for name, field in form.fields.items():
        bound = form[name]
        value = bound.value()
        key = bound.html_name
        if isinstance(field, forms.BooleanField):
            if value:
                data[key] = "on"
        elif isinstance(field, forms.ModelMultipleChoiceField):
            data[key] = [str(getattr(v, "pk", v)) for v in (value or [])]
        elif isinstance(field, forms.SplitDateTimeField):
            widget_value = field.widget.decompress(value) if value else ["", ""]
            data[f"{key}_0"] = str(widget_value[0] or "")
            data[f"{key}_1"] = str(widget_value[1] or "")
        elif value is None:
            data[key] = ""
        else:  # BoundField.value() is already prepared for the widget
            data[key] = str(getattr(value, "pk", value))


def change_form_data(response) -> dict:
    data: dict = {}
    _add(data, response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        _add(data, formset.management_form)
        for form in formset.initial_forms:
            _add(data, form)
    return data
