"""The upgrade moves DRF's plaintext tokens into hashed ApiTokens and drops their table."""

import hashlib
import importlib
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken

migration = importlib.import_module("apps.accounts.migrations.0002_move_drf_tokens")

DRF_KEY = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"  # DRF's format: 40 hex characters


@pytest.fixture
def drf_token_table():
    """``authtoken_token`` as rest_framework.authtoken's migrations left it on a database."""
    datetime_type = connection.data_types["DateTimeField"]
    with connection.schema_editor() as editor:
        editor.execute(
            "CREATE TABLE authtoken_token "
            f"(key varchar(40) NOT NULL PRIMARY KEY, created {datetime_type} NOT NULL, user_id integer NOT NULL)"
        )
    MigrationRecorder(connection).record_applied("authtoken", "0001_initial")
    yield
    with connection.schema_editor() as editor:
        editor.execute("DROP TABLE IF EXISTS authtoken_token")


@pytest.mark.django_db(transaction=True)  # DDL: SQLite's schema editor refuses to run inside a transaction
def test_the_migration_hashes_each_drf_token_and_drops_their_table(drf_token_table, member, settings):
    created = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
            [DRF_KEY, connection.ops.adapt_datetimefield_value(created), member.pk],
        )

    with connection.schema_editor() as editor:
        migration.move_drf_tokens(apps, editor)

    token = ApiToken.objects.get()
    assert (token.user_id, token.prefix, token.created_at) == (member.pk, DRF_KEY[:8], created)
    assert token.digest == hashlib.sha256(DRF_KEY.encode()).hexdigest()
    assert DRF_KEY not in {str(value) for value in ApiToken.objects.values().get().values()}
    expected_expiry = timezone.now() + timedelta(days=settings.GRIDGATE_TOKEN_DAYS)
    assert abs(token.expires_at - expected_expiry) < timedelta(minutes=1)
    assert "authtoken_token" not in connection.introspection.table_names()
    assert not MigrationRecorder(connection).migration_qs.filter(app="authtoken").exists()
    # The client holding the old key goes on working.
    client = APIClient(HTTP_AUTHORIZATION=f"Token {DRF_KEY}")
    assert client.get("/api/v1/backends/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_migration_does_nothing_on_a_database_that_never_had_drf_tokens():
    with connection.schema_editor() as editor:
        migration.move_drf_tokens(apps, editor)
    assert not ApiToken.objects.exists()
