from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    # One loop for every periodic pass (apps.core.ticker); it replaces per-app ticker schedules.
    ensure_schedule(apps, name="gridgate.tick", func="apps.core.tasks.tick", minutes=1)


def backwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.tick")


class Migration(migrations.Migration):
    dependencies = [("core", "0005_cleanup_schedule")]

    operations = [migrations.RunPython(forwards, backwards)]
