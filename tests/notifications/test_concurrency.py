"""R-NOTE-1 under concurrency: workers delivering at the same time never send one delivery twice."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction

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


def test_unsubscribing_while_a_job_end_is_recorded_never_undoes_the_record(owner, monkeypatch):
    """A job ends: the worker's transaction records it and puts its ``job.finished`` delivery in
    the outbox, for the owner's webhook. The owner unsubscribes at that moment, and the deletion
    commits first. The delivery still names the deleted subscription, so the job's record failed
    at its commit (a deferred foreign key: IntegrityError), the worker's pass died and the job
    stayed running, its end unrecorded and uncharged until its lease expired."""
    import threading

    from apps.notifications import services as notifications
    from apps.scheduling import passes
    from apps.scheduling import services as scheduling
    from apps.scheduling.models import Job, JobStatus
    from tests import factories

    pool = factories.pool("qpu", strategy="fifo")
    factories.device(pool, "fake1", config={"script": ["completed"], "runtime_seconds": 5})
    session = factories.session(pool, owner)
    job = scheduling.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    passes.run_pool(pool.pk)  # dispatched; the fake device completes it at the next poll
    subscription, _ = notifications.create_subscription(
        user=owner, event=Event.JOB_FINISHED, channel="webhook", url="https://h.example.org/x"
    )
    queued, deleted = threading.Event(), threading.Event()
    original = notifications.notify

    def notify(**kwargs):
        count = original(**kwargs)
        queued.set()  # the delivery is in the job's end transaction, not committed yet
        deleted.wait(5)  # the unsubscribe commits first, unless a lock makes it wait for us
        return count

    monkeypatch.setattr(notifications, "notify", notify)
    outcomes = {}

    def finish():
        try:
            Job.objects.filter(pk=job.pk).update(next_poll_at=None)
            passes.poll_running(pool.pk)
            outcomes["worker"] = "recorded"
        except Exception as exc:
            outcomes["worker"] = type(exc).__name__
        finally:
            connection.close()

    def unsubscribe():
        try:
            assert queued.wait(30)
            notifications.delete_subscription(user=owner, subscription_id=subscription.pk)
            outcomes["unsubscribe"] = "deleted"
        except Exception as exc:
            outcomes["unsubscribe"] = type(exc).__name__
        finally:
            deleted.set()
            connection.close()

    threads = [threading.Thread(target=finish), threading.Thread(target=unsubscribe)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes == {"worker": "recorded", "unsubscribe": "deleted"}
    assert Job.objects.get(pk=job.pk).status == JobStatus.COMPLETED
    assert not Subscription.objects.filter(pk=subscription.pk).exists()
    assert not Delivery.objects.exists()  # nothing is sent to a destination the user removed


def test_an_operator_deleting_a_subscription_while_a_job_end_is_recorded_waits_for_it(owner, staff, monkeypatch):
    """The admin's delete page removes a subscription as its owner's unsubscribe does (its row
    locked first). Django's own delete collected the subscription's deliveries, then waited at its
    row for a job's end that was enqueueing a delivery for it: that delivery, committed meanwhile,
    still named the deleted subscription, and the page's commit failed (a deferred foreign key,
    a 500), the subscription kept."""
    import threading

    from django.test import Client

    from apps.notifications import services as notifications

    staff.is_superuser = True
    staff.save()
    subscription, _ = notifications.create_subscription(
        user=owner, event=Event.JOB_FINISHED, channel="webhook", url="https://h.example.org/x"
    )
    queued, deleted = threading.Event(), threading.Event()
    outcomes = {}

    def job_ends():
        try:
            with transaction.atomic():
                outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:1", payload={"job": 1})
                queued.set()  # in the job's end transaction, not committed yet
                deleted.wait(5)  # the deletion commits first, unless a lock makes it wait for us
            outcomes["producer"] = "committed"
        except Exception as exc:
            outcomes["producer"] = type(exc).__name__
        finally:
            connection.close()

    def operator_deletes():
        try:
            assert queued.wait(30)
            client = Client(raise_request_exception=False)
            client.force_login(staff)
            response = client.post(f"/admin/notifications/subscription/{subscription.pk}/delete/", {"post": "yes"})
            outcomes["admin"] = response.status_code
        finally:
            deleted.set()
            connection.close()

    threads = [threading.Thread(target=job_ends), threading.Thread(target=operator_deletes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes == {"producer": "committed", "admin": 302}
    assert not Subscription.objects.filter(pk=subscription.pk).exists()
    assert not Delivery.objects.exists()  # nothing is sent to a destination the operator removed
