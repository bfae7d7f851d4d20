"""R-NOTE-1 under concurrency: workers delivering at the same time never send one delivery twice."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.notifications import outbox, passes
from apps.notifications.models import Delivery, DeliveryStatus, Event, Subscription
from tests.concurrency import held_together

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_concurrent_delivery_passes_send_each_webhook_exactly_once(owner, subscribe, receiver):
    subscribe(owner, Event.JOB_FINISHED, "webhook", receiver.url)
    outbox.notify_many((Event.JOB_FINISHED, owner.pk, f"job:{i}", {"i": i}) for i in range(60))
    assert Delivery.objects.count() == 60

    def worker(_):
        try:
            sent = 0
            while True:
                report = passes.deliver_due(batch=4)
                if not report["claimed"]:
                    return sent
                sent += report["delivered"]
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        delivered = sum(pool.map(worker, range(6)))
    ids = [request["headers"]["X-Gridgate-Delivery"] for request in receiver.requests]
    assert delivered == 60
    assert len(ids) == 60 and len(set(ids)) == 60
    assert Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 60


def test_two_subscriptions_to_a_new_url_at_once_share_one_secret(owner, monkeypatch):
    """Two events subscribed to one new URL at the same time (a script subscribing in parallel):
    each used to look for the URL's secret before taking the user's lock, find none and make its
    own, so the receiver got two signing keys for one URL."""
    from apps.credentials import sealing
    from apps.notifications import services

    held_together(monkeypatch, sealing, "seal")

    def subscribe(event):
        try:
            return services.create_subscription(
                user=owner, event=event, channel="webhook", url="https://h.example.org/x"
            )
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        made = list(pool.map(subscribe, [Event.JOB_FINISHED, Event.JOB_FAILED]))
    shown = [secret for _, secret in made if secret]
    assert len(shown) == 1
    kept = {sealing.unseal(value) for value in Subscription.objects.values_list("secret_sealed", flat=True)}
    assert kept == set(shown)


def test_two_subscriptions_at_the_cap_at_once_never_pass_it(owner, monkeypatch, settings):
    """The cap is counted under the user's row lock: two requests in flight at once, each about to
    save, end in one subscription and one 409, never two over the cap."""
    from apps.notifications import services

    settings.GRIDGATE_NOTIFY_MAX_SUBSCRIPTIONS = 1
    held_together(monkeypatch, Subscription, "save")

    def subscribe(url):
        try:
            services.create_subscription(user=owner, event=Event.JOB_FINISHED, channel="webhook", url=url)
            return "made"
        except services.Conflict:
            return "refused"
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(subscribe, ["https://a.example.org/x", "https://b.example.org/x"]))
    assert sorted(outcomes) == ["made", "refused"]
    assert Subscription.objects.filter(user=owner).count() == 1
