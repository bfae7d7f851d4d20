"""``manage.py demo`` writes six days of finished activity once, so the utilization page shows
something after ``make run`` and no worker has anything to do with it."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.accounting.selectors import utilization
from apps.cases.models import Case
from apps.scheduling.models import UNFINISHED, Job
from apps.sessions.models import Session

pytestmark = pytest.mark.django_db


def test_demo_history_fills_the_charts_once_and_leaves_nothing_to_run(settings):
    settings.DEBUG = True
    call_command("demo")
    counts = (Session.objects.count(), Job.objects.count(), Case.objects.count())
    assert counts[1] > 50 and counts[2] > 5
    call_command("demo")  # re-run: the history is not written twice
    assert (Session.objects.count(), Job.objects.count(), Case.objects.count()) == counts

    assert not Session.objects.active().exists()  # no slot held, nothing for admission to count
    assert not Job.objects.filter(status__in=UNFINISHED).exists()
    assert not Case.objects.filter(status__in=["prepared", "pending", "running"]).exists()

    now = timezone.now()
    pools = {pool.name: pool for pool in utilization(now - timedelta(days=7), now).pools}
    qpu = pools["qpu"]
    assert any(qpu.slots) and any(qpu.busy_seconds) and qpu.dispatched > 50
    assert qpu.wait_p95_all > qpu.wait_p50_all > 0  # bursts queue behind each other
    assert sum(pools["local"].cases.values()) == counts[2]
