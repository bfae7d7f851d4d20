"""Fixtures for the user pages: logged-in clients, a QPU pool with a fake device, an isolated
cases root served by the fake backend (so no page test starts a process)."""

import pytest
from django.test import Client

from apps.backends.fake import FakeBackend
from tests import factories


@pytest.fixture
def web():
    """``web(user)`` → a Django test client logged in as ``user`` (None: anonymous)."""

    def make(user):
        client = Client()
        if user is not None:
            client.force_login(user)
        return client

    return make


@pytest.fixture
def cases_root(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake"}
    FakeBackend.reset()
    yield settings.GRIDGATE_CASES_ROOT
    FakeBackend.reset()


@pytest.fixture(autouse=True)
def _fresh_launch_options_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def qpu_pool(db):
    return factories.pool("emulators", slots_total=2, strategy="fifo")


@pytest.fixture
def fake_device(qpu_pool):
    return factories.device(qpu_pool, "fake1", config={"script": ["running", "completed"]})
