"""R-NOTE-1: a finished job reaches e-mail and a signed webhook once each, retried after a 500,
never duplicated; a failed job is its own event; the outbound rules hold at delivery time."""

import hashlib
import hmac
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from apps.notifications import passes
from apps.notifications.models import Delivery, DeliveryStatus, Event
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling import passes as scheduling
from apps.scheduling import services as jobs
from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions import services as sessions

pytestmark = pytest.mark.django_db


def run_job(user, script):
    """A job of ``user`` on a fake device that reports ``script``, run to its end."""
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, slots_total=10)
    klass = ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="fake1", driver="fake", config={"script": script})
    session = sessions.admit(user=user, resource_class=klass).session
    job = jobs.submit_job(user=user, session_id=session.pk, payload={"sequence": "x"}, shots=1)
    for _ in range(6):
        Job.objects.filter(pk=job.pk).update(next_poll_at=None)
        scheduling.run_pool(pool.pk)
        job.refresh_from_db()
        if job.status != JobStatus.RUNNING:
            break
    return job


def later(seconds=3600):
    return timezone.now() + timedelta(seconds=seconds)


def test_a_finished_job_arrives_once_by_email_and_once_by_signed_webhook_retried_after_a_500(
    owner_with_email, subscribe, receiver
):
    subscribe(owner_with_email, Event.JOB_FINISHED, "email")
    _, secret = subscribe(owner_with_email, Event.JOB_FINISHED, "webhook", receiver.url)
    receiver.codes = [500]

    job = run_job(owner_with_email, ["running", "completed"])
    assert job.status == JobStatus.COMPLETED
    # The producer running again (a second _finish of the same end) enqueues nothing more.
    scheduling.notify_job_ended(job, JobStatus.COMPLETED, timezone.now())
    assert Delivery.objects.count() == 2

    first = passes.deliver_due()
    assert first["delivered"] == 1 and first["retried"] == 1  # the e-mail; the webhook got a 500
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["owner@example.org"]
    assert f"Job {job.pk} finished" in mail.outbox[0].subject
    assert passes.deliver_due()["claimed"] == 0  # the retry waits for its back-off

    second = passes.deliver_due(now=later())
    assert second == {"claimed": 1, "delivered": 1, "retried": 0, "failed": 0, "skipped": 0}
    assert passes.deliver_due(now=later(2 * 3600))["claimed"] == 0  # nothing is sent twice

    assert len(mail.outbox) == 1
    assert len(receiver.requests) == 2  # the 500, then the retry
    ids = {r["headers"]["X-Gridgate-Delivery"] for r in receiver.requests}
    assert len(ids) == 1  # the same delivery both times: a receiver can drop a repeat
    for request in receiver.requests:
        expected = "sha256=" + hmac.new(secret.encode(), request["body"], hashlib.sha256).hexdigest()
        assert hmac.compare_digest(request["headers"]["X-Gridgate-Signature"], expected)
        assert request["headers"]["X-Gridgate-Event"] == "job.finished"
    body = receiver.payloads()[-1]
    assert body["event"] == "job.finished" and body["data"]["job"]["id"] == job.pk
    webhook = Delivery.objects.get(subscription__channel="webhook")
    assert webhook.status == DeliveryStatus.DELIVERED and webhook.attempts == 2
    assert list(webhook.log.values_list("ok", "status_code")) == [(False, 500), (True, 200)]


def test_a_failed_job_produces_job_failed_and_not_job_finished(owner_with_email, subscribe):
    subscribe(owner_with_email, Event.JOB_FINISHED)
    subscribe(owner_with_email, Event.JOB_FAILED)
    job = run_job(owner_with_email, ["running", "failed"])
    assert job.status == JobStatus.FAILED
    assert list(Delivery.objects.values_list("event", "subject")) == [("job.failed", f"job:{job.pk}")]
    passes.deliver_due()
    assert [m.subject for m in mail.outbox] == [f"[Gridgate] Job {job.pk} ended failed"]


def test_nothing_is_enqueued_for_a_user_who_subscribed_to_nothing(owner_with_email, member, subscribe):
    member.email = "member@example.org"
    member.save(update_fields=["email"])
    subscribe(member, Event.JOB_FINISHED)  # someone else's choice is not the owner's
    run_job(owner_with_email, ["running", "completed"])
    assert Delivery.objects.count() == 0


def test_a_webhook_whose_name_moved_to_a_private_address_is_refused_at_delivery(
    owner_with_email, subscribe, resolver, monkeypatch
):
    import httpx

    subscribe(owner_with_email, Event.JOB_FINISHED, "webhook", "https://hooks.example.org/in")
    resolver["hooks.example.org"] = ["93.184.216.34", "10.0.0.1"]  # DNS changed since
    sent = []

    async def send(*args, **kwargs):
        sent.append(args)
        raise httpx.ConnectError("no connection in this test")

    monkeypatch.setattr(httpx.AsyncClient, "send", send)
    run_job(owner_with_email, ["running", "completed"])
    report = passes.deliver_due()
    assert report["failed"] == 1 and sent == []
    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.FAILED
    assert "10.0.0.1" in delivery.last_error and "not allowed" in delivery.last_error


def test_a_webhook_is_retried_with_backoff_and_given_up_after_the_last_attempt(
    owner_with_email, subscribe, receiver, settings
):
    settings.GRIDGATE_NOTIFY_MAX_ATTEMPTS = 3
    subscribe(owner_with_email, Event.JOB_FINISHED, "webhook", receiver.url)
    receiver.codes = [503, 503, 503, 503]
    run_job(owner_with_email, ["running", "completed"])
    for hours in (0, 1, 3, 6):
        passes.deliver_due(now=later(hours * 3600) if hours else None)
    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 3
    assert len(receiver.requests) == 3


def test_email_goes_to_the_account_address_read_at_delivery_and_nowhere_without_one(owner_with_email, subscribe):
    subscribe(owner_with_email, Event.JOB_FINISHED)
    run_job(owner_with_email, ["running", "completed"])
    owner_with_email.email = ""
    owner_with_email.save(update_fields=["email"])
    passes.deliver_due()
    assert mail.outbox == []
    assert Delivery.objects.get().status == DeliveryStatus.FAILED


def test_a_name_with_a_newline_never_splits_the_email_subject(owner_with_email, subscribe):
    from apps.notifications import outbox

    subscribe(owner_with_email, Event.CASE_FINISHED)
    summary = "Case x\nBcc: victim@example.org finished"
    outbox.notify(user=owner_with_email, event=Event.CASE_FINISHED, subject="case:1", payload={"summary": summary})
    assert passes.deliver_due()["delivered"] == 1
    assert "\n" not in mail.outbox[0].subject and mail.outbox[0].bcc == []


def test_a_receiver_dripping_its_answer_is_cut_off_at_the_deadline_and_retried(
    owner_with_email, subscribe, receiver, settings
):
    settings.GRIDGATE_NOTIFY_TIMEOUT_SECONDS = 1  # each read gets a byte within it: only the deadline ends it
    receiver.drip = True
    subscribe(owner_with_email, Event.JOB_FINISHED, "webhook", receiver.url)
    run_job(owner_with_email, ["running", "completed"])
    assert passes.deliver_due()["retried"] == 1
    delivery = Delivery.objects.get()
    assert delivery.status == DeliveryStatus.PENDING and delivery.last_error == "no answer within 2 s"


def test_one_users_backlog_of_slow_webhooks_never_holds_back_another_users_notification(
    owner, member, subscribe, monkeypatch
):
    """A user whose receivers answer slowly (each call runs to its deadline) and who has many
    deliveries due first: another user's delivery due after them goes out in the same pass,
    second, not after the backlog."""
    from apps.notifications import outbox, transports

    for number in range(5):
        subscribe(owner, Event.JOB_FINISHED, "webhook", f"https://slow{number}.example.org/hook")
    subscribe(member, Event.JOB_FINISHED, "webhook", "https://hooks.example.org/hook")
    start = timezone.now() - timedelta(minutes=10)
    for number in range(40):  # 200 deliveries of the owner's, all due before the member's
        outbox.notify(user=owner, event=Event.JOB_FINISHED, subject=f"job:{number}", payload={}, now=start)
    outbox.notify(user=member, event=Event.JOB_FINISHED, subject="job:1000", payload={})

    clock, sent = [0.0], []

    def slow_send(delivery):
        clock[0] += 2 * 10  # a receiver that answers at the whole call's deadline
        sent.append(delivery.user_id)
        return transports.Outcome(False, error="no answer within 20 s")

    monkeypatch.setattr(passes.transports, "send", slow_send)
    monkeypatch.setattr(passes.time, "monotonic", lambda: clock[0])

    passes.deliver_due()

    assert sent[:2] == [owner.pk, member.pk], sent
    assert Delivery.objects.get(user=member).attempts == 1


def test_a_users_burst_alone_fills_the_batch(owner, subscribe, monkeypatch):
    """Turns, not a cap: with nobody else's delivery due, one user's backlog goes out a whole
    batch per pass."""
    from apps.notifications import outbox, transports

    subscribe(owner, Event.JOB_FINISHED, "webhook", "https://hooks.example.org/hook")
    for number in range(60):
        outbox.notify(user=owner, event=Event.JOB_FINISHED, subject=f"job:{number}", payload={})
    monkeypatch.setattr(passes.transports, "send", lambda delivery: transports.Outcome(True))

    assert passes.deliver_due(batch=50)["claimed"] == 50


def test_a_receiver_redirecting_elsewhere_is_never_followed_and_the_delivery_fails(
    owner_with_email, subscribe, receiver
):
    """A redirect would take the POST to an address the outbound rules never checked (here an
    internal service on the loopback): it is not followed, and it is not a delivery."""
    from tests.notifications.conftest import Receiver

    inside = Receiver()
    try:
        receiver.codes, receiver.location = [307], inside.url
        subscribe(owner_with_email, Event.JOB_FINISHED, "webhook", receiver.url)
        run_job(owner_with_email, ["running", "completed"])
        assert passes.deliver_due()["failed"] == 1
        assert inside.requests == []
    finally:
        inside.stop()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.last_error) == (DeliveryStatus.FAILED, "the receiver answered 307")


def test_a_receivers_rate_limit_or_timeout_answer_is_retried_after_the_first_delay_then_twice_it(
    owner_with_email, subscribe, receiver, settings
):
    import time_machine

    settings.GRIDGATE_NOTIFY_RETRY_SECONDS = 60
    subscribe(owner_with_email, Event.JOB_FINISHED, "webhook", receiver.url)
    receiver.codes = [429, 408]
    run_job(owner_with_email, ["running", "completed"])
    first, second = later(5), later(3600)
    for at, retry_at in ((first, first + timedelta(seconds=60)), (second, second + timedelta(seconds=120))):
        with time_machine.travel(at, tick=False):
            assert passes.deliver_due()["retried"] == 1
        delivery = Delivery.objects.get()
        assert (delivery.status, delivery.next_attempt_at) == (DeliveryStatus.PENDING, retry_at)
    assert passes.deliver_due(now=later(7200))["delivered"] == 1


def test_what_a_pass_had_no_time_to_send_is_left_to_the_next_pass_at_once(owner, subscribe, monkeypatch):
    from apps.notifications import outbox, transports

    subscribe(owner, Event.JOB_FINISHED, "webhook", "https://hooks.example.org/hook")
    for number in range(3):
        outbox.notify(user=owner, event=Event.JOB_FINISHED, subject=f"job:{number}", payload={})
    clock = [0.0]

    def slow_send(delivery):
        clock[0] += passes.LEASE_SECONDS  # past half the lease: the pass stops after this one
        return transports.Outcome(True)

    monkeypatch.setattr(passes.transports, "send", slow_send)
    monkeypatch.setattr(passes.time, "monotonic", lambda: clock[0])
    assert passes.deliver_due() == {"claimed": 3, "delivered": 1, "retried": 0, "failed": 0, "skipped": 0}
    assert passes.deliver_due()["delivered"] == 1  # the next pass, now: not after the lease
    assert passes.deliver_due()["delivered"] == 1


def test_a_worker_whose_lease_was_taken_over_records_nothing(owner, subscribe, monkeypatch):
    """The first worker stalled past its lease: another claimed the delivery and is sending it.
    The first one's outcome is not recorded over the second's work."""
    from apps.notifications import outbox, transports

    subscribe(owner, Event.JOB_FINISHED, "webhook", "https://hooks.example.org/hook")
    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:1", payload={})

    def stalled_send(delivery):
        Delivery.objects.filter(pk=delivery.pk).update(lease_owner="worker-2", lease_until=later(300))
        return transports.Outcome(True)

    monkeypatch.setattr(passes.transports, "send", stalled_send)
    assert passes.deliver_due()["skipped"] == 1
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.lease_owner) == (DeliveryStatus.PENDING, 0, "worker-2")
