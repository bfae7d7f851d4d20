"""``RemoteConnection`` moves here from the backends app in Django's state only: its table keeps
its name (``db_table``), its rows and its constraints, so nothing in the database moves. Its
content type is renamed along, so the permissions staff were given on it still hold."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def rename_content_type(apps, schema_editor, old="backends", new="credentials"):
    content_type = apps.get_model("contenttypes", "ContentType")
    if not content_type.objects.filter(app_label=new, model="remoteconnection").exists():
        content_type.objects.filter(app_label=old, model="remoteconnection").update(app_label=new)


def rename_content_type_back(apps, schema_editor):
    rename_content_type(apps, schema_editor, old="credentials", new="backends")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("backends", "0002_connection_provider_urls"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("resources", "0010_pool_allowed_networks"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="RemoteConnection",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "state",
                            models.CharField(
                                choices=[("connected", "Connected"), ("failed", "Failed: reconnect")],
                                default="connected",
                                max_length=16,
                            ),
                        ),
                        (
                            "sealed_secret",
                            models.TextField(
                                editable=False,
                                help_text="Fernet ciphertext under GRIDGATE_CREDENTIALS_KEY; never shown.",
                            ),
                        ),
                        (
                            "subject",
                            models.CharField(
                                blank=True,
                                default="",
                                help_text="The provider's subject (sub) or account.",
                                max_length=255,
                            ),
                        ),
                        ("provider_username", models.CharField(blank=True, default="", max_length=255)),
                        (
                            "issuer",
                            models.CharField(
                                blank=True, default="", help_text="The token's issuer (iss).", max_length=255
                            ),
                        ),
                        ("connected_at", models.DateTimeField()),
                        ("last_refreshed_at", models.DateTimeField(blank=True, null=True)),
                        ("failed_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "failure",
                            models.CharField(
                                blank=True,
                                default="",
                                help_text="Why the provider refused it (no secret).",
                                max_length=500,
                            ),
                        ),
                        ("generation", models.PositiveIntegerField(default=1, editable=False)),
                        ("provider_urls", models.JSONField(blank=True, default=dict, editable=False)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        (
                            "pool",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="remote_connections",
                                to="resources.resourcepool",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="remote_connections",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "backends_remoteconnection",
                        "ordering": ["user_id", "pool_id", "id"],
                        "constraints": [
                            models.UniqueConstraint(fields=("user", "pool"), name="backends_connection_one_per_pool"),
                            models.CheckConstraint(
                                condition=models.Q(("sealed_secret", ""), _negated=True),
                                name="backends_connection_sealed",
                                violation_error_message="A connection holds its sealed credential.",
                            ),
                        ],
                    },
                ),
            ],
        ),
        migrations.RunPython(rename_content_type, rename_content_type_back),
    ]
