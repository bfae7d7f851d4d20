"""Usability in a real Chromium: keyboard focus and text selections survive live updates, no page
scrolls sideways at phone width, unconfigured backends do not look usable, the launch dialog never
lands on Launch, and the forms keep what was typed, confirm what ends something and say what they
send. No fixed sleeps: every wait is on a response or a condition, bounded by TIMEOUT_MS."""

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from apps.cases import services as case_services
from apps.cases import workspace
from apps.cases.models import Case, CaseStatus
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device, Job
from apps.sessions.services import admit
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


@pytest.fixture
def alice(transactional_db):
    return get_user_model().objects.create_user("alice", password="alice-pw")


@pytest.fixture
def pools(transactional_db):
    local = ResourcePool.objects.create(name="local", kind="local", public=True, default=True)
    ResourceClass.objects.create(pool=local, name="small", cpu=1, memory=2, default=True)
    qpu = ResourcePool.objects.create(name="qpu", kind="local", public=True, slots_total=4, strategy="fifo")
    ResourceClass.objects.create(pool=qpu, name="access", cpu=1, memory=1, default=True)
    # Offline: jobs stay pending, so their lists keep polling for the whole test.
    Device.objects.create(pool=qpu, name="emulator", driver="emulator", online=False)
    return {"local": local, "qpu": qpu}


def _pending_job(alice, pools) -> Job:
    session = admit(user=alice, resource_class=pools["qpu"].classes.get(), slots=1).session
    payload = {"sequence": "{}"}
    return Job.objects.create(
        session=session, pool=pools["qpu"], user=alice, payload=payload, shots=10, created_at=timezone.now()
    )


def _running_case(alice, pools, stdout: str) -> Case:
    case = case_services.create_case(
        owner=alice, resource_class=pools["local"].classes.get(), name="long-run", command="sleep 600"
    )
    Case.objects.filter(pk=case.pk).update(
        status=CaseStatus.RUNNING, backend="local", remote_id="r-1", started_at=timezone.now()
    )
    root = workspace.case_dir(case.pk)
    (root / workspace.LOGS["stdout"]).write_text(stdout)
    return Case.objects.get(pk=case.pk)


def _polls(page, fragment: str, count: int = 3) -> None:
    """Wait for ``count`` htmx polls of the fragment whose URL contains ``fragment``."""
    for _ in range(count):
        with page.expect_response(lambda r: fragment in r.url and r.request.headers.get("hx-request") == "true"):
            pass


def _active_id(page) -> str:
    return page.evaluate("document.activeElement && document.activeElement.id")


def test_focus_on_cancel_survives_three_polls_of_the_job_table(page, site, alice, pools):
    job = _pending_job(alice, pools)
    log_in(page, site.url, "alice", "alice-pw")
    page.goto(f"{site.url}/jobs/")
    cancel = page.get_by_role("button", name=f"Cancel job {job.pk}")
    cancel.focus()
    _polls(page, "/jobs/")
    assert _active_id(page) == f"cancel-job-{job.pk}"
    page.keyboard.press("Enter")  # the keyboard user can still cancel
    expect(page.get_by_text(f"Job {job.pk}: cancelled")).to_be_visible()


def test_focus_on_refresh_and_a_log_selection_survive_three_polls_of_a_running_case(page, site, alice, pools):
    case = _running_case(alice, pools, "line one\nline two to copy\nline three\n")
    log_in(page, site.url, "alice", "alice-pw")
    page.goto(f"{site.url}/cases/{case.pk}/")
    page.evaluate(
        """() => {
        const pre = document.getElementById('stdout-tail');
        const text = pre.firstChild;
        const start = text.data.indexOf('line two to copy');
        const range = document.createRange();
        range.setStart(text, start);
        range.setEnd(text, start + 'line two to copy'.length);
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
    }"""
    )
    _polls(page, f"/cases/{case.pk}/")
    assert page.evaluate("window.getSelection().toString()") == "line two to copy"
    page.get_by_role("button", name="Refresh now").focus()
    _polls(page, f"/cases/{case.pk}/")
    assert _active_id(page) == "refresh-case"


def test_no_page_scrolls_sideways_at_phone_width(page, site, alice, pools, screenshots_dir):
    job = _pending_job(alice, pools)
    case = _running_case(alice, pools, "x" * 500 + "\n")
    page.set_viewport_size(PHONE)
    try:
        page.goto(f"{site.url}/login/")
        paths = [
            "/",
            "/sessions/",
            f"/sessions/{job.session_id}/",
            "/jobs/",
            f"/jobs/{job.pk}/",
            "/cases/",
            f"/cases/{case.pk}/",
        ]
        log_in(page, site.url, "alice", "alice-pw")
        for path in paths:
            page.goto(f"{site.url}{path}")
            page.wait_for_load_state("networkidle")
            width = page.evaluate("document.documentElement.scrollWidth")
            wide = page.evaluate(
                "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > "
                "window.innerWidth + 1).slice(0, 5).map(e => e.tagName + '.' + e.className + '#' + e.id)"
            )
            assert width <= PHONE["width"], f"{path} is {width}px wide at {PHONE['width']}px: {wide}"
            header = page.evaluate(
                "(() => { const r = document.querySelector('.who').getBoundingClientRect();"
                " const h = document.querySelector('header.top').getBoundingClientRect();"
                " return r.bottom <= h.bottom && r.right <= window.innerWidth; })()"
            )
            assert header, f"{path}: the user name and Log out leave the header"
        page.goto(f"{site.url}/")
        page.screenshot(path=screenshots_dir / "phone-home.png", full_page=True)
        page.goto(f"{site.url}/sessions/{job.session_id}/")
        page.screenshot(path=screenshots_dir / "phone-session.png", full_page=True)
    finally:
        page.set_viewport_size(DESKTOP)


def test_a_pool_whose_backend_is_not_set_up_says_so_and_cannot_be_launched_on(
    page, site, settings, alice, pools, monkeypatch, screenshots_dir, link_account
):
    link_account(alice)  # the local pool runs cases as their owner's account: offered to a linked user
    settings.GRIDGATE_CASE_BACKENDS = {"local": "local", "firecrest": "firecrest"}
    monkeypatch.delenv("GRIDGATE_CRED_FIRECREST_CLIENT_ID", raising=False)
    monkeypatch.delenv("GRIDGATE_CRED_FIRECREST_CLIENT_SECRET", raising=False)
    hpc = ResourcePool.objects.create(
        name="hpc",
        kind="firecrest",
        public=True,
        remote={
            "api_url": "https://firecrest.example.org",
            "system_name": "daint",
            "token_uri": "https://auth.example.org/token",
            "working_root": "/scratch/gridgate",
            "credentials": "service",
        },
    )
    ResourceClass.objects.create(pool=hpc, name="node", cpu=2, memory=4, default=True)
    case = case_services.create_case(owner=alice, resource_class=hpc.classes.get(), name="stuck", command="echo")

    log_in(page, site.url, "alice", "alice-pw")
    card = page.locator("section.pool", has=page.get_by_role("heading", name="hpc"))
    expect(card.locator(".use.down")).to_contain_text("Cases cannot run on this pool yet")
    expect(card.locator(".use.ok")).to_have_count(0)
    assert "FIRECREST_CLIENT" not in card.inner_text()  # no variable names for users
    qpu = page.locator("section.pool", has=page.get_by_role("heading", name="qpu"))
    expect(qpu.locator(".tag").first).to_have_text("QPU")
    expect(qpu.locator(".use").first).to_contain_text("Takes jobs")

    page.get_by_role("link", name="Cases").click()
    # all_inner_texts() does not wait: wait for the new page's form before reading its options.
    page.wait_for_url(f"{site.url}/cases/")
    expect(page.get_by_label("Class").locator("option", has_text="local/small")).to_have_count(1)
    offered = page.get_by_label("Class").locator("option").all_inner_texts()
    assert "local/small" in offered and not any(text.startswith(("hpc/", "qpu/")) for text in offered)

    page.goto(f"{site.url}/cases/{case.pk}/")
    page.get_by_role("button", name="Launch…").click()
    dialog = page.locator("#launch-dialog")
    expect(dialog.locator("#launch-not-ready")).to_contain_text("Ask an administrator")
    expect(dialog.get_by_role("button", name="Launch")).to_have_count(0)
    page.screenshot(path=screenshots_dir / "launch-not-ready.png")


def test_reopened_launch_dialog_focuses_the_first_field_or_the_summary_never_launch(page, site, alice, pools):
    case = case_services.create_case(
        owner=alice, resource_class=pools["local"].classes.get(), name="focus", command="echo ok"
    )
    log_in(page, site.url, "alice", "alice-pw")
    page.goto(f"{site.url}/cases/{case.pk}/")
    dialog = page.locator("#launch-dialog")
    for _ in range(2):
        page.get_by_role("button", name="Launch…").click()
        expect(dialog.get_by_role("button", name="Launch")).to_be_visible()
        page.wait_for_function(
            "document.activeElement && document.activeElement.closest('#launch-dialog-body')"
            " && (document.activeElement.matches('[data-first-field]') || document.activeElement.id === 'summary-h')"
        )
        assert _active_id(page) != "launch-submit"
        page.keyboard.press("Escape")
        expect(dialog).not_to_be_visible()
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED


def test_refused_session_keeps_the_typed_slots_and_focuses_its_message(page, site, alice, pools):
    log_in(page, site.url, "alice", "alice-pw")
    card = page.locator("section.pool", has=page.get_by_role("heading", name="qpu"))
    card.get_by_role("spinbutton", name="Slots").fill("9")
    card.get_by_role("button", name="Open session on qpu/access").click()
    message = page.locator("#open-refused")
    expect(message).to_contain_text("no room for that many slots right now (4 free)")
    expect(message).to_be_focused()
    expect(card.get_by_role("spinbutton", name="Slots")).to_have_value("9")
    assert "(409)" not in message.inner_text()


def test_release_asks_first_and_then_reads_released_by_you(page, site, alice, pools):
    session = admit(user=alice, resource_class=pools["qpu"].classes.get(), slots=1).session
    log_in(page, site.url, "alice", "alice-pw")
    page.goto(f"{site.url}/sessions/{session.pk}/")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Release session").click()
    expect(page.locator("#session-status")).to_have_text("Active")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Release session").click()
    expect(page.locator("#session-status")).to_have_text("Released by you")


def test_cancel_case_asks_first(page, site, alice, pools):
    case = case_services.create_case(
        owner=alice, resource_class=pools["local"].classes.get(), name="keep", command="echo ok"
    )
    log_in(page, site.url, "alice", "alice-pw")
    page.goto(f"{site.url}/cases/{case.pk}/")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.get_by_role("button", name="Cancel case").click()
    expect(page.locator("#case-status")).to_have_text("Prepared")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel case").click()
    expect(page.locator("#case-status")).to_have_text("Cancelled")


def test_job_form_says_what_it_sends_and_takes_the_examples_shots(page, site, alice, pools):
    session = admit(user=alice, resource_class=pools["qpu"].classes.get(), slots=1).session
    log_in(page, site.url, "alice", "alice-pw")
    page.goto(f"{site.url}/sessions/{session.pk}/")
    expect(page.get_by_label("Shots")).to_have_value("500")  # the example's own shots
    expect(page.locator("#job-source")).to_contain_text("the example “bell-like-analog”")
    page.get_by_label("Shots").fill("7")
    page.get_by_label("Bundled example").select_option("")
    page.get_by_label("Bundled example").select_option("bell-like-analog")
    expect(page.get_by_label("Shots")).to_have_value("500")
    page.get_by_label("Or upload a sequence (JSON)").set_input_files(
        [{"name": "mine.json", "mimeType": "application/json", "buffer": b"{}"}]
    )
    expect(page.locator("#job-source")).to_contain_text("the uploaded file “mine.json” (the example is ignored)")
