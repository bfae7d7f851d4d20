"""What an administrator types by hand: an add page's values from its query string (``?user=3``,
the links that open a prefilled form) and an autocomplete field's value sent with a form: a value
its field does not take is left out or a form error, never a 500."""

import pytest
from django.contrib import admin

from apps.core.admin_base import FieldValues

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url",
    [
        "/admin/accounts/identity/add/?user=abc",  # an autocomplete field's query
        "/admin/allocations/allocation/add/?user=%C2%B2",  # '²': str.isdigit() but no int
        "/admin/scheduling/fairshare/add/?user=1,2",
        "/admin/reservations/reservation/add/?start=2026-13-45",  # the split date-time widget
        "/admin/reservations/reservation/add/?end=abc",
        "/admin/auth/user/add/?groups=x,1",  # a many-to-many: one bad id drops the value
        "/admin/django_q/schedule/add/?next_run=2026-12-07",  # another app's page
    ],
)
def test_an_add_page_leaves_out_a_value_its_field_does_not_take(admin_client, url):
    assert admin_client.get(url).status_code == 200


def test_an_add_page_keeps_the_values_its_fields_take(admin_client, owner, local_pool):
    query = f"start=2026-12-07T09:30&pool={local_pool.pk}&users={owner.pk}"
    page = admin_client.get(f"/admin/reservations/reservation/add/?{query}")
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert (form.initial["pool"], form.initial["users"]) == (local_pool.pk, [owner.pk])
    assert (form.initial["start"].date().isoformat(), form.initial["start"].strftime("%H:%M")) == (
        "2026-12-07",
        "09:30",
    )
    assert 'value="2026-12-07"' in page.content.decode()


@pytest.mark.parametrize(
    "url, field",
    [
        ("/admin/accounts/identity/add/", "user"),
        ("/admin/allocations/allocation/add/", "user"),
        ("/admin/allocations/allocation/add/", "group"),
        ("/admin/scheduling/fairshare/add/", "user"),
        ("/admin/qrmi/unixaccount/add/", "user"),
    ],
)
@pytest.mark.parametrize("value", ["abc", "\u00b2", "1,2"])
def test_an_autocomplete_field_sent_an_id_it_does_not_take_is_a_form_error(admin_client, url, field, value):
    page = admin_client.post(url, {field: value})
    assert page.status_code == 200
    assert field in page.context["adminform"].form.errors


def test_every_admin_page_with_an_add_form_reads_what_is_typed_through_the_one_rule(staff):
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = staff
    staff.is_superuser = True
    pages = [page for page in admin.site._registry.values() if page.has_add_permission(request)]
    assert pages and [type(page).__name__ for page in pages if not isinstance(page, FieldValues)] == []
