"""The utilization page in a real Chromium: a staff user follows the admin's link to the
utilization page, picks a day with known activity, and the charts are drawn (SVG columns, points
and bars) with their numbers readable; the page fits a phone. The screenshot goes to the user guide
(``make screenshots`` writes docs/screenshots/utilization.png)."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from playwright.sync_api import expect

from tests.accounting.conftest import make_history
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def operator(transactional_db):
    return get_user_model().objects.create_user("operator", password="operator-pw", is_staff=True, is_superuser=True)


@pytest.fixture
def known_day(transactional_db):
    return make_history()


def test_the_utilization_page_draws_a_known_day_from_the_admins_link(page, site, operator, known_day, screenshots_dir):
    log_in(page, site.url, "operator", "operator-pw")
    page.goto(f"{site.url}/admin/")
    page.get_by_role("link", name="Utilization charts").click()
    expect(page.get_by_role("heading", name="Utilization", exact=True)).to_be_visible()

    page.get_by_label("Period", exact=True).select_option("custom")
    page.get_by_label("From", exact=True).fill("2026-11-01")
    page.get_by_label("To (included)").fill("2026-11-01")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#period-summary")).to_have_text("From 2026-11-01 00:00 to 2026-11-02 00:00 UTC, per hour.")

    qpu_id = known_day["qpu"].pk
    qpu = page.locator("section.pool-use", has=page.get_by_role("heading", name="qpu"))
    slots = qpu.locator(f"figure#pool-{qpu_id}-slots svg")
    expect(slots).to_be_visible()
    assert slots.locator("rect.col").count() == 24  # slots held in every hour of the day
    assert slots.locator("line.reference").count() == 1  # the pool's 10 slots
    busy = qpu.locator(f"figure#pool-{qpu_id}-busy svg")
    assert busy.locator("rect.col").count() == 5  # hours 0, 2, 4, 5 and 23
    wait = qpu.locator(f"figure#pool-{qpu_id}-wait svg")
    assert wait.locator("circle.point-p50").count() == 3 and wait.locator("circle.point-p95").count() == 3
    assert wait.locator("polyline").count() >= 2
    for figure in (slots, busy, wait):
        box = figure.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 100  # drawn, not collapsed

    # The numbers, readable beside the pictures.
    expect(qpu.locator(".figures")).to_contain_text("Queue wait p5010 s")
    expect(qpu.locator(".figures")).to_contain_text("Queue wait p9520 s")
    expect(qpu.get_by_text("over the period p50 10 s and p95 20 s (22 jobs)")).to_be_visible()
    expect(qpu.get_by_text("23 job(s) created in the period: 1 pending, 1 running, 21 completed.")).to_be_visible()
    assert qpu.locator("svg.bars rect.bar").count() == 3
    local = page.locator("section.pool-use", has=page.get_by_role("heading", name="local"))
    expect(local.get_by_text("3 case(s) created in the period: 2 done, 1 failed.")).to_be_visible()
    expect(page.get_by_text("Nothing in this period: quiet.")).to_be_visible()

    # The table alternative opens with the same numbers.
    qpu.get_by_text("Queue wait p50 and p95: the numbers").click()
    row = qpu.locator(f"#pool-{qpu_id}-wait tr", has_text="2026-11-01 02:00–03:00")
    expect(row).to_contain_text("10 s")
    expect(row).to_contain_text("19 s")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert slots.bounding_box()["width"] <= PHONE["width"]


def test_the_demo_week_is_drawn_for_the_readme(page, site, screenshots_dir):
    """What ``make run`` shows: ``manage.py demo``'s six days of history, the last 7 days."""
    call_command("demo", "--force")  # its staff account: admin/admin
    log_in(page, site.url, "admin", "admin")
    page.goto(f"{site.url}/utilization/?period=7d")
    qpu = page.locator("section.pool-use", has=page.get_by_role("heading", name="qpu"))
    expect(qpu.locator("svg.series").first).to_be_visible()
    assert qpu.locator("svg.series").count() == 3
    assert qpu.locator("svg.series rect.col").count() > 20
    assert qpu.locator("svg.series circle.point-p95").count() > 10
    expect(qpu.locator(".figures")).to_contain_text("Queue wait p95")
    page.screenshot(path=screenshots_dir / "utilization.png", full_page=True)


def test_a_reversed_period_says_so_in_the_browser(page, site, operator):
    log_in(page, site.url, "operator", "operator-pw")
    page.goto(f"{site.url}/utilization/?period=custom&since=2026-11-02&until=2026-11-01")
    expect(page.get_by_role("alert")).to_contain_text("The From date must be on or before the To date.")
    assert page.locator("svg.series").count() == 0
