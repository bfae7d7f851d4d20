"""R-NOTE-1 under concurrency: workers delivering at the same time never send one delivery twice."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.notifications import outbox, passes
from apps.notifications.models import Delivery, DeliveryStatus, Event

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
