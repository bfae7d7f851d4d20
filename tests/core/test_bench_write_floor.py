"""bench/http_load.py's write floor (SPEC §9): a bench's route, never part of the product."""

import importlib

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.urls import NoReverseMatch, clear_url_caches, reverse
from rest_framework.test import APIClient

from apps.accounts.services import issue_token
from apps.core.api.views import WRITE_FLOOR_TABLE_SQL

pytestmark = pytest.mark.django_db

PATH = "/api/v1/bench/write-floor/"


def reload_urls():
    # The route is chosen when the URLconf is imported: import it again under the settings in force.
    importlib.reload(importlib.import_module(settings.ROOT_URLCONF))
    clear_url_caches()


@pytest.fixture
def write_floor_mounted(db):
    """The URLconf as the bench's server has it (GRIDGATE_BENCH_WRITE_FLOOR=true), and the
    table the bench creates; both gone after the test (the table with the test's transaction)."""
    try:
        with override_settings(GRIDGATE_BENCH_WRITE_FLOOR=True):
            reload_urls()
            with connection.cursor() as cursor:
                cursor.execute(WRITE_FLOOR_TABLE_SQL)
            yield
    finally:
        reload_urls()


def rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM bench_write_floor")
        return cursor.fetchone()[0]


def token_client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user)[1]}")
    return client


def test_write_floor_has_no_route_by_default(member):
    assert settings.GRIDGATE_BENCH_WRITE_FLOOR is False
    with pytest.raises(NoReverseMatch):
        reverse("bench-write-floor")
    # Authenticated, so that the 404 is the missing route's and not a refusal.
    assert token_client(member).post(PATH).status_code == 404


@pytest.mark.postgres
def test_authenticated_write_floor_inserts_one_row(write_floor_mounted, member):
    response = token_client(member).post(PATH)
    assert response.status_code == 204, response.content
    assert rows() == 1


@pytest.mark.postgres
def test_anonymous_write_floor_is_refused_and_writes_nothing(write_floor_mounted):
    assert APIClient().post(PATH).status_code == 401
    assert rows() == 0
