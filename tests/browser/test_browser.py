"""End to end in a real Chromium: log in, open a session, run a Pulser job on the emulator and see
its chart; create and launch a case on the local backend and download its result; the launch
dialog still opens when the backend cannot be asked. Screenshots of the main pages are saved on
the way (``make screenshots`` writes them to docs/screenshots/)."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from apps.backends.base import BackendError
from apps.backends.local import LocalBackend
from apps.cases import services as case_services
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device, Job
from tests.browser.conftest import TIMEOUT_MS, log_in

# postgres: the live server, the worker thread and the test share the database concurrently, which
# SQLite's in-memory test database does not support (the tests are skipped there, reason printed).
pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def alice(transactional_db):
    return get_user_model().objects.create_user("alice", password="alice-pw")


@pytest.fixture
def pools(transactional_db):
    local = ResourcePool.objects.create(name="local", kind="local", public=True, default=True)
    ResourceClass.objects.create(pool=local, name="small", cpu=1, memory=2, default=True)
    ResourceClass.objects.create(pool=local, name="large", cpu=4, memory=16)
    qpu = ResourcePool.objects.create(
        name="qpu",
        kind="local",
        public=True,
        slots_total=4,
        accessibility_message="Emulated AnalogDevice, open to all",
    )
    ResourceClass.objects.create(pool=qpu, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=qpu, name="emulator", driver="emulator", config={"pulser_device": "AnalogDevice"})
    return {"local": local, "qpu": qpu}


def test_log_in_open_a_session_and_see_a_pulser_job_complete_with_a_chart(
    page, site, worker, alice, pools, screenshots_dir
):
    log_in(page, site.url, "alice", "alice-pw")
    expect(page.get_by_text("Emulated AnalogDevice, open to all")).to_be_visible()
    page.screenshot(path=screenshots_dir / "home.png", full_page=True)

    page.get_by_role("button", name="Open session on qpu/access").click()
    expect(page.get_by_role("heading", name="Launch specification")).to_be_visible()
    expect(page.locator("#session-status")).to_have_text("Active")

    page.get_by_label("Bundled example").select_option("bell-like-analog")
    page.get_by_label("Shots").fill("300")
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_text("submitted with 300 shots")).to_be_visible()
    job = Job.objects.get(user=alice)
    row = page.locator(f"#job-{job.pk}")
    expect(row.locator(".status")).to_have_text("Completed", timeout=TIMEOUT_MS)  # the list updates itself
    page.screenshot(path=screenshots_dir / "session.png", full_page=True)

    row.get_by_role("link", name=f"Job {job.pk}").click()
    chart = page.locator("figure.chart svg")
    expect(chart).to_be_visible()
    expect(page.get_by_text("Counts over 300 shots")).to_be_visible()
    assert chart.locator("rect.bar").count() >= 1
    page.screenshot(path=screenshots_dir / "job.png", full_page=True)


def test_create_and_launch_a_case_on_the_local_backend_then_download_its_result(
    page, site, worker, alice, pools, screenshots_dir, tmp_path, link_account
):
    link_account(alice)  # R-CASE-8: the case runs as alice's own Unix account
    log_in(page, site.url, "alice", "alice-pw")
    page.get_by_role("link", name="Cases").click()
    page.get_by_label("Name").fill("uppercase")
    page.get_by_label("Class").select_option(label="local/small")
    page.get_by_label("Command").fill(
        "echo 0.5 > .gridgate/progress; tr a-z A-Z < words.txt > shout.txt; echo solved; echo 'a warning' >&2"
    )
    page.get_by_label("Input files").set_input_files(
        [{"name": "words.txt", "mimeType": "text/plain", "buffer": b"hello gridgate\n"}]
    )
    page.screenshot(path=screenshots_dir / "cases.png", full_page=True)
    page.get_by_role("button", name="Create case").click()
    expect(page.locator("#case-status")).to_have_text("Prepared")
    expect(page.get_by_role("link", name="inputs/words.txt")).to_be_visible()

    page.get_by_role("button", name="Launch…").click()
    dialog = page.locator("#launch-dialog")
    expect(dialog.get_by_role("heading", name="What will be submitted")).to_be_visible()
    expect(dialog.get_by_text("tr a-z A-Z", exact=False)).to_be_visible()
    page.screenshot(path=screenshots_dir / "launch-dialog.png")
    dialog.get_by_role("button", name="Launch").click()

    expect(page.locator("#case-status")).to_have_text("Done", timeout=TIMEOUT_MS)
    expect(page.locator("#stdout-tail")).to_contain_text("solved")
    expect(page.locator("#stderr-tail")).to_contain_text("a warning")
    expect(page.locator("#case-progress")).to_have_attribute("value", "100")
    result = page.get_by_role("link", name="results/shout.txt")
    expect(result).to_be_visible()
    page.screenshot(path=screenshots_dir / "case.png", full_page=True)

    with page.expect_download() as download_info:
        result.click()
    saved = tmp_path / "shout.txt"
    download_info.value.save_as(saved)
    assert saved.read_text() == "HELLO GRIDGATE\n"


def test_launch_dialog_still_opens_when_the_backend_options_are_degraded(
    page, site, worker, alice, pools, screenshots_dir, monkeypatch, link_account
):
    link_account(alice)

    def unreachable(self, pool, identity=None):
        raise BackendError("the provider did not answer (connection refused)")

    monkeypatch.setattr(LocalBackend, "launch_options", unreachable)
    case = case_services.create_case(
        owner=alice, resource_class=pools["local"].classes.get(name="large"), name="degraded", command="echo ok"
    )
    log_in(page, site.url, "alice", "alice-pw")
    page.goto(f"{site.url}/cases/{case.pk}/")
    page.get_by_role("button", name="Launch…").click()
    dialog = page.locator("#launch-dialog")
    expect(dialog.locator("#launch-degraded")).to_contain_text("connection refused")
    expect(dialog.get_by_role("heading", name="What will be submitted")).to_be_visible()
    page.screenshot(path=screenshots_dir / "launch-degraded.png")
    dialog.get_by_role("button", name="Launch").click()  # the defaults still launch
    expect(page.locator("#case-status")).to_have_text("Done", timeout=TIMEOUT_MS)


def test_a_script_injected_into_a_page_does_not_run_under_its_content_security_policy(page, site, alice, pools):
    """F12: no Content-Security-Policy: markup injected into a page (a name, a log line that
    escaped its escaping) could run script. The policy allows script files of the site only; the
    pages' own htmx and charts work under it: every browser test fails on any other violation
    (tests/browser/conftest.py)."""
    log_in(page, site.url, "alice", "alice-pw")
    page.evaluate(
        """() => new Promise(resolve => {
            document.addEventListener("securitypolicyviolation", () => resolve(), {once: true});
            document.body.insertAdjacentHTML("beforeend", '<img src="/no-such-image" onerror="window.pwned = 1">');
        })"""
    )
    assert page.evaluate("window.pwned") is None
    page.expected_csp_violations = 1  # the one refused above, and no other on the way
    page.goto(f"{site.url}/api/docs/")  # Swagger UI from its own script file
    expect(page.locator(".swagger-ui .info")).to_be_visible(timeout=TIMEOUT_MS)
