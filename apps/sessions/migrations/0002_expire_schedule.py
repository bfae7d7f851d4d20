from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    ensure_schedule(apps, name="gridgate.expire_sessions", func="apps.sessions.tasks.expire_sessions", minutes=1)


def backwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.expire_sessions")


class Migration(migrations.Migration):
    dependencies = [
        ("compute_sessions", "0001_initial"),
        ("core", "0002_heartbeat_schedule"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
