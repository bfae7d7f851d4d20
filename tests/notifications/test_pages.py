"""R-NOTE-1's user page: subscribe (a webhook's secret shown once), see the log, unsubscribe."""

import pytest

from apps.notifications import outbox
from apps.notifications.models import Event, Subscription

pytestmark = pytest.mark.django_db

PAGE = "/notifications/"


@pytest.fixture
def browser(client, owner):
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    client.force_login(owner)
    return client


def test_the_page_subscribes_by_webhook_and_shows_the_secret_once(browser, owner):
    response = browser.post(
        PAGE, {"event": "job.finished", "channel": "webhook", "url": "https://hooks.example.org/in"}
    )
    assert response.status_code == 201
    page = response.content.decode()
    assert "Signing secret" in page and "no-store" in response.headers.get("Cache-Control", "")
    subscription = Subscription.objects.get(user=owner)
    again = browser.get(PAGE).content.decode()
    assert "https://hooks.example.org/in" in again and "Signing secret" not in again
    assert subscription.secret_sealed not in page


def test_the_page_refuses_a_private_webhook_in_words(browser):
    response = browser.post(PAGE, {"event": "job.finished", "channel": "webhook", "url": "https://10.0.0.1/in"})
    assert response.status_code == 400
    assert "not allowed" in response.content.decode()
    assert not Subscription.objects.exists()


def test_the_page_lists_deliveries_and_unsubscribes(browser, owner, outsider):
    browser.post(PAGE, {"event": "job.failed", "channel": "email"})
    subscription = Subscription.objects.get(user=owner)
    outbox.notify(user=owner, event=Event.JOB_FAILED, subject="job:42", payload={})
    assert "job:42" in browser.get(PAGE).content.decode()
    assert browser.post(f"/notifications/{subscription.pk + 1000}/delete/").status_code == 404
    response = browser.post(f"/notifications/{subscription.pk}/delete/", follow=True)
    assert response.status_code == 200 and "Unsubscribed" in response.content.decode()
    assert not Subscription.objects.exists()


def test_someone_elses_subscription_cannot_be_deleted(client, owner, outsider, subscribe):
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    subscription, _ = subscribe(owner, Event.JOB_FAILED)
    client.force_login(outsider)
    assert client.post(f"/notifications/{subscription.pk}/delete/").status_code == 404
    assert Subscription.objects.filter(pk=subscription.pk).exists()
    assert client.get(PAGE).status_code == 200
