"""Browser tests: Debian's Chromium driven by Playwright for Python, against pytest-django's
live server (a thread of this process, so settings and monkeypatches apply to it).

No browser is ever downloaded: Playwright is pointed at ``GRIDGATE_CHROMIUM`` (default
``/usr/bin/chromium``). Without it the tests are skipped with the reason printed; under CI
(``CI=true``, where ``.ci/run`` installs it) they fail instead.
"""

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from django.db import connection

from tests.backends.conftest import link_account, sandbox_host  # noqa: F401 - cases run as real accounts (R-CASE-8)

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make around
# it are still synchronous and safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("GRIDGATE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 60_000  # bound of every wait for a live update (polling, never a fixed sleep)


def missing_reason() -> str:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set GRIDGATE_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"playwright is not installed ({exc}): make test installs requirements-dev.txt"
    return ""


@pytest.fixture(scope="session")
def screenshots_dir(tmp_path_factory) -> Path:
    """``GRIDGATE_SCREENSHOTS_DIR`` (``make screenshots``: docs/screenshots), else a temp dir."""
    target = os.environ.get("GRIDGATE_SCREENSHOTS_DIR")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def browser_context():
    reason = missing_reason()
    if reason and os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true requires the browser tests to run: {reason}")
    if reason:
        pytest.skip(f"browser test skipped: {reason}")
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="gridgate-chromium-")  # a fresh user-data dir
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            accept_downloads=True,
        )
        context.set_default_timeout(TIMEOUT_MS)
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser_context):
    """A page; every Content-Security-Policy violation the browser reports on it fails the test
    (F12: the pages, their htmx and their charts work under the policy)."""
    browser_context.clear_cookies()
    page = browser_context.new_page()
    violations = []
    page.on(
        "console",
        lambda message: (
            violations.append(f"{page.url}: {message.text}") if "Content Security Policy" in message.text else None
        ),
    )
    page.csp_violations = violations
    yield page
    page.close()
    expected = getattr(page, "expected_csp_violations", 0)
    assert len(violations) == expected, "\n".join(violations)


@pytest.fixture
def site(live_server, settings, tmp_path):
    """The live server set up as a single-host deployment whose worker runs beside it."""
    settings.GRIDGATE_TASKS_EAGER = True  # scheduling tasks run inline once their transaction commits
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    settings.GRIDGATE_CASE_BACKENDS = {"local": "local"}
    settings.GRIDGATE_CASE_MIN_UID = 100  # the linked test accounts are system accounts (useradd --system)
    settings.GRIDGATE_CASE_POLL_SECONDS = 1
    settings.GRIDGATE_CASE_SYNC_SECONDS = 1
    settings.GRIDGATE_CASE_REFRESH_SECONDS = 0
    from django.core.cache import cache

    cache.clear()
    return live_server


class Worker(threading.Thread):
    """What ``manage.py qcluster`` does for this test: the case passes and the scheduling sweep,
    again and again until stopped (the passes claim work with leases, as in production)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []

    def run(self):
        from apps.cases import passes
        from apps.scheduling import passes as scheduling

        try:
            while not self.stopping.wait(0.25):
                for step in (passes.submit_pass, passes.poll_pass, passes.sync_pass, scheduling.sweep):
                    try:
                        step()
                    except Exception as exc:  # keep going like the ticker; reported at teardown
                        self.errors.append(exc)
        finally:
            connection.close()


@pytest.fixture
def worker(site):
    thread = Worker()
    thread.start()
    yield thread
    thread.stopping.set()
    thread.join(timeout=30)
    assert not thread.errors, thread.errors


def log_in(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Pools you can use").wait_for()
