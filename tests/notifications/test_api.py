"""R-NOTE-1's API: /api/v1/notifications/ (your subscriptions) and /api/v1/notifications/deliveries/."""

import pytest

from apps.credentials import sealing
from apps.notifications import outbox, passes
from apps.notifications.models import Delivery, Event, Subscription

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications/"


def test_a_webhook_subscription_shows_its_secret_once_and_keeps_it_sealed(api, owner):
    response = api(owner).post(
        URL, {"event": "job.finished", "channel": "webhook", "url": "https://hooks.example.org/x"}
    )
    assert response.status_code == 201, response.content
    secret = response.json()["secret"]
    assert len(secret) >= 40
    stored = Subscription.objects.get(pk=response.json()["id"])
    assert secret not in stored.secret_sealed and sealing.unseal(stored.secret_sealed) == secret
    listed = api(owner).get(URL).json()
    assert [item["id"] for item in listed["results"]] == [stored.pk]
    assert secret not in str(listed) and "secret" not in listed["results"][0]
    assert "secret" not in api(owner).get(f"{URL}{stored.pk}/").json()


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://10.0.0.1/hook",
        "https://[::1]/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://internal.example.org/hook",  # resolves to 10.0.0.1
        "http://hooks.example.org/hook",  # not https
        "https://user:pw@hooks.example.org/hook",
    ],
)
def test_a_webhook_to_loopback_private_or_insecure_urls_is_refused_at_subscription(api, owner, resolver, url):
    resolver["internal.example.org"] = ["10.0.0.1"]
    response = api(owner).post(URL, {"event": "job.finished", "channel": "webhook", "url": url})
    assert response.status_code == 400, response.content
    assert "url" in response.json()
    assert not Subscription.objects.exists()


def test_loopback_is_refused_unless_the_operator_allows_it(api, owner, settings):
    body = {"event": "job.finished", "channel": "webhook", "url": "https://127.0.0.1:8443/hook"}
    assert api(owner).post(URL, body).status_code == 400
    settings.GRIDGATE_OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    assert api(owner).post(URL, body).status_code == 201


def test_email_takes_no_url_and_needs_an_address_on_the_account(api, owner):
    assert api(owner).post(URL, {"event": "job.failed", "channel": "email"}).json() == {
        "channel": ["Your account has no e-mail address to send to."]
    }
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    response = api(owner).post(URL, {"event": "job.failed", "channel": "email", "url": "https://a.example.org/"})
    assert response.status_code == 400 and "url" in response.json()
    response = api(owner).post(URL, {"event": "job.failed", "channel": "email"})
    assert response.status_code == 201 and response.json()["secret"] is None
    assert api(owner).post(URL, {"event": "job.failed", "channel": "email"}).status_code == 409


def test_webhooks_are_refused_with_503_without_a_sealing_key(api, owner, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = []
    body = {"event": "job.finished", "channel": "webhook", "url": "https://hooks.example.org/x"}
    response = api(owner).post(URL, body)
    assert response.status_code == 503 and "GRIDGATE_CREDENTIALS_KEY" in response.json()["detail"]


def test_bad_input_is_a_400_not_a_500(api, owner):
    for body in ({}, {"event": "nope", "channel": "email"}, {"event": "job.failed", "channel": "pigeon"}):
        assert api(owner).post(URL, body, format="json").status_code == 400
    long = "https://hooks.example.org/" + "a" * 3000
    assert api(owner).post(URL, {"event": "job.failed", "channel": "webhook", "url": long}).status_code == 400


def test_other_users_subscriptions_and_deliveries_are_404_and_invisible(api, owner, outsider, subscribe):
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    subscription, _ = subscribe(owner, Event.JOB_FINISHED)
    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:1", payload={"summary": "Job 1 finished"})
    delivery = Delivery.objects.get()
    assert api(outsider).get(f"{URL}{subscription.pk}/").status_code == 404
    assert api(outsider).delete(f"{URL}{subscription.pk}/").status_code == 404
    assert api(outsider).get(f"{URL}deliveries/{delivery.pk}/").status_code == 404
    assert api(outsider).get(URL).json()["results"] == []
    assert api(outsider).get(f"{URL}deliveries/").json()["results"] == []
    assert api(None).get(URL).status_code in (401, 403)


def test_the_delivery_log_lists_each_attempt_and_unsubscribing_drops_pending_deliveries(api, owner, subscribe):
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    subscription, _ = subscribe(owner, Event.JOB_FINISHED)
    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:1", payload={"summary": "Job 1 finished"})
    passes.deliver_due()
    deliveries = api(owner).get(f"{URL}deliveries/").json()["results"]
    assert len(deliveries) == 1
    assert deliveries[0]["status"] == "delivered" and deliveries[0]["channel"] == "email"
    assert [attempt["ok"] for attempt in deliveries[0]["log"]] == [True]
    assert api(owner).get(f"{URL}deliveries/?status=failed").json()["results"] == []

    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:2", payload={})
    assert api(owner).delete(f"{URL}{subscription.pk}/").status_code == 204
    assert not Delivery.objects.exists()
    assert passes.deliver_due()["claimed"] == 0


def test_admin_lists_subscriptions_and_deliveries_and_retries_a_failed_one(admin_client, owner, subscribe):
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    subscribe(owner, Event.JOB_FINISHED)
    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:7", payload={})
    owner.email = ""
    owner.save(update_fields=["email"])
    passes.deliver_due()
    delivery = Delivery.objects.get()
    assert delivery.status == "failed"
    assert admin_client.get("/admin/notifications/subscription/").status_code == 200
    page = admin_client.get("/admin/notifications/delivery/?status=failed")
    assert page.status_code == 200 and "job:7" in page.content.decode()
    assert admin_client.get(f"/admin/notifications/delivery/{delivery.pk}/change/").status_code == 200
    response = admin_client.post(
        "/admin/notifications/delivery/", {"action": "retry", "_selected_action": [delivery.pk]}, follow=True
    )
    assert "1 delivery(ies) due again" in response.content.decode()
    delivery.refresh_from_db()
    assert delivery.status == "pending" and delivery.attempts == 0
    assert admin_client.get("/admin/notifications/subscription/add/").status_code == 403


def test_the_admins_retry_leaves_delivered_notifications_alone(admin_client, owner, subscribe):
    """Retrying a selection that holds a delivered notification sends only the failed ones again:
    the delivered one is never sent twice."""
    from django.core import mail

    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    subscribe(owner, Event.JOB_FINISHED)
    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:7", payload={})
    passes.deliver_due()
    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:8", payload={})
    Delivery.objects.filter(subject="job:8").update(status="failed", attempts=5, next_attempt_at=None)
    response = admin_client.post(
        "/admin/notifications/delivery/",
        {"action": "retry", "_selected_action": list(Delivery.objects.values_list("pk", flat=True))},
        follow=True,
    )
    assert "1 delivery(ies) due again" in response.content.decode()
    passes.deliver_due()
    assert sorted(Delivery.objects.values_list("subject", "status", "attempts")) == [
        ("job:7", "delivered", 1),
        ("job:8", "delivered", 1),
    ]
    assert len(mail.outbox) == 2  # job:7 once, job:8 once


def test_a_key_rotation_reseals_webhook_secrets(owner, subscribe, settings):
    from cryptography.fernet import Fernet
    from django.core.management import call_command

    subscription, secret = subscribe(owner, Event.JOB_FINISHED, "webhook", "https://hooks.example.org/x")
    old = settings.GRIDGATE_CREDENTIALS_KEY[0]
    new = Fernet.generate_key().decode()
    settings.GRIDGATE_CREDENTIALS_KEY = [new, old]
    call_command("reseal_connections")
    settings.GRIDGATE_CREDENTIALS_KEY = [new]  # the old key dropped
    subscription.refresh_from_db()
    assert sealing.unseal(subscription.secret_sealed) == secret


def test_cleanup_drops_old_sent_and_failed_deliveries_but_never_pending_ones(owner, subscribe):
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone

    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    subscribe(owner, Event.JOB_FINISHED)
    old = timezone.now() - timedelta(days=200)
    for i, status in enumerate(["delivered", "failed", "pending"]):
        outbox.notify(user=owner, event=Event.JOB_FINISHED, subject=f"job:{i}", payload={}, now=old)
        Delivery.objects.filter(subject=f"job:{i}").update(status=status)
    outbox.notify(user=owner, event=Event.JOB_FINISHED, subject="job:new", payload={})
    Delivery.objects.filter(subject="job:new").update(status="delivered")
    call_command("cleanup", "--days", "90")
    assert sorted(Delivery.objects.values_list("subject", flat=True)) == ["job:2", "job:new"]


def test_a_second_event_to_the_same_url_shares_its_secret_and_does_not_show_it_again(api, owner):
    first = api(owner).post(URL, {"event": "job.finished", "channel": "webhook", "url": "https://hooks.example.org/x"})
    second = api(owner).post(URL, {"event": "job.failed", "channel": "webhook", "url": "https://hooks.example.org/x"})
    assert second.status_code == 201 and second.json()["secret"] is None
    sealed = Subscription.objects.filter(user=owner).values_list("secret_sealed", flat=True)
    assert {sealing.unseal(value) for value in sealed} == {first.json()["secret"]}
    other = api(owner).post(URL, {"event": "job.failed", "channel": "webhook", "url": "https://other.example.org/x"})
    assert other.json()["secret"] not in (None, first.json()["secret"])


def test_a_user_cannot_hold_more_subscriptions_than_the_cap(api, owner, settings):
    settings.GRIDGATE_NOTIFY_MAX_SUBSCRIPTIONS = 2
    for i in range(2):
        body = {"event": "job.finished", "channel": "webhook", "url": f"https://hooks.example.org/{i}"}
        assert api(owner).post(URL, body).status_code == 201
    body = {"event": "job.finished", "channel": "webhook", "url": "https://hooks.example.org/2"}
    response = api(owner).post(URL, body)
    assert response.status_code == 409 and "delete one first" in response.json()["detail"]
    assert Subscription.objects.filter(user=owner).count() == 2


@pytest.mark.parametrize("address", ["64:ff9b::a9fe:a9fe", "2002:a00:1::1", "192.0.0.192"])
def test_a_webhook_whose_name_reaches_a_private_address_through_ipv6_is_refused(api, owner, resolver, address):
    """NAT64 and 6to4 addresses carry an IPv4 address a gateway connects to: it is checked too."""
    resolver["hooks.example.org"] = [address]
    body = {"event": "job.finished", "channel": "webhook", "url": "https://hooks.example.org/hook"}
    response = api(owner).post(URL, body)
    assert response.status_code == 400, response.content
    assert not Subscription.objects.exists()


@pytest.mark.parametrize("url", ["https://[::1/hook", "https://[hooks.example.org]/hook", "https://]x[/"])
def test_a_webhook_url_that_cannot_be_parsed_is_400_not_500(api, owner, url):
    response = api(owner).post(URL, {"event": "job.finished", "channel": "webhook", "url": url})
    assert response.status_code == 400, response.content
    assert "url" in response.json()
    assert not Subscription.objects.exists()
