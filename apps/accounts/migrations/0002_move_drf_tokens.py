"""Hashed API tokens: DRF's plaintext tokens (``authtoken_token``, from ``rest_framework.authtoken``, no
longer installed) become hashed ApiTokens, and their table goes.

The table is looked for by introspection, not through the authtoken app's migrations (the app is
gone, so they cannot be depended on): a new database never had it, an old one keeps it until this
runs. Every old key keeps working, until GRIDGATE_TOKEN_DAYS after the upgrade: it never expired
before, so no client is cut off without notice.
"""

import hashlib
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import migrations
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone
from django.utils.dateparse import parse_datetime

DRF_TABLE = "authtoken_token"
DRF_APP = "authtoken"


def _aware(value, default):
    if not isinstance(value, datetime):  # SQLite may hand back the stored text
        value = parse_datetime(str(value)) if value else None
    if value is None:
        return default
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def move_drf_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if DRF_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("accounts", "ApiToken")
    now = timezone.now()
    expires_at = now + timedelta(days=settings.GRIDGATE_TOKEN_DAYS)
    table = schema_editor.quote_name(DRF_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id, created FROM {table}")  # noqa: S608 - a fixed name, quoted
        rows = cursor.fetchall()
    ApiToken.objects.bulk_create(
        [
            ApiToken(
                user_id=user_id,
                digest=hashlib.sha256(key.encode()).hexdigest(),
                prefix=key[:8],
                name="from before hashed tokens",
                created_at=_aware(created, now),
                expires_at=expires_at,
            )
            for key, user_id, created in rows
        ],
        batch_size=500,
    )
    schema_editor.execute(schema_editor.sql_delete_table % {"table": table})
    # The app's migrations are recorded as applied; were it ever installed again, migrate must
    # create its table rather than take it for present.
    MigrationRecorder(connection).migration_qs.filter(app=DRF_APP).delete()


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_api_token")]

    # Not reversible in substance (the plaintext keys are gone): going back leaves the tokens be.
    operations = [migrations.RunPython(move_drf_tokens, migrations.RunPython.noop)]
