from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    ensure_schedule(apps, name="gridgate.scheduling_tick", func="apps.scheduling.tasks.tick", minutes=1)


def backwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.scheduling_tick")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0001_initial"),
        ("core", "0002_heartbeat_schedule"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
