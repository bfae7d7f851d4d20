"""Two edits of one pool at once (the API's PATCH, the admin's save: both ``save_pool``): each is
checked against the pool as the other left it, so a rule over two fields holds however the
edits interleave."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from apps.resources.models import ResourcePool
from apps.resources.services import InvalidFields, save_pool
from tests import factories
from tests.admin_forms import change_form_data
from tests.concurrency import held_together

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def edit(pool_id: int, fields: dict) -> str:
    try:
        save_pool(pool=ResourcePool.objects.get(pk=pool_id), fields=fields)
        return "saved"
    except InvalidFields:
        return "refused"
    finally:
        connection.close()


def at_once(pool_id: int, first: dict, second: dict) -> list[str]:
    """The two edits, each held just before its checks until the other gets there too (or, where
    a lock holds it back, for a few seconds alone)."""
    with ThreadPoolExecutor(max_workers=2) as executor:
        both = [executor.submit(edit, pool_id, first), executor.submit(edit, pool_id, second)]
        return sorted(future.result() for future in both)


def test_two_operators_making_a_pool_trusted_and_public_at_once_get_a_clear_refusal(monkeypatch):
    """R-CASE-8: a trusted pool (cases run as the service's own account) is never public. One
    operator makes a private pool trusted while another makes it public: each edit alone is valid.
    With the pool's row read without a lock both checks pass before either save and the second
    save breaks the table's check constraint (an IntegrityError: a 500 on the admin page); with it
    the second edit waits, reads the first's commit and is refused with the rule's words."""
    pool = factories.pool("host", public=False)
    held_together(monkeypatch, ResourcePool, "full_clean")

    assert at_once(pool.pk, {"trusted": True}, {"public": True}) == ["refused", "saved"]
    pool.refresh_from_db()
    assert not (pool.trusted and pool.public)


def test_allowed_networks_added_while_the_network_is_turned_off_never_both_stay(monkeypatch):
    """Allowed networks only widen a pool's network: one operator adds one while another turns the
    network off. Without the row lock both are saved, and the pool lists networks it never opens
    (no constraint catches it); with it the second is refused."""
    pool = factories.pool("host", network=True)
    held_together(monkeypatch, ResourcePool, "full_clean")

    assert at_once(pool.pk, {"allowed_networks": "10.1.2.0/24"}, {"network": False}) == ["refused", "saved"]
    pool.refresh_from_db()
    assert pool.network or not pool.allowed_networks


def test_two_operators_saving_a_pools_admin_page_at_once_never_break_its_rules(monkeypatch):
    """The same race on the admin page, which checks its form against the pool it read. A page
    posts every field as its operator saw it, so the later save stands whole (the admin's way);
    without the lock both forms were checked against the row before either save, and the second
    broke the check constraint (a 500); with it the second is checked against the first's row."""
    pool = factories.pool("host", public=False)
    operator = factories.user("root", is_staff=True, is_superuser=True)
    url = reverse("admin:resources_resourcepool_change", args=[pool.pk])
    browser = Client()
    browser.force_login(operator)
    page = change_form_data(browser.get(url))
    held_together(monkeypatch, ResourcePool, "full_clean")

    def save(change: dict) -> int:
        try:
            operator_browser = Client()
            operator_browser.force_login(operator)
            return operator_browser.post(url, {**page, **change}).status_code
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        both = [executor.submit(save, {"trusted": "on"}), executor.submit(save, {"public": "on"})]
        assert [future.result() for future in both] == [302, 302]
    pool.refresh_from_db()
    assert not (pool.trusted and pool.public)
