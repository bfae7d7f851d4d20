from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    ensure_schedule(apps, name="gridgate.cleanup", func="apps.core.tasks.cleanup", minutes=24 * 60)


def backwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.cleanup")


class Migration(migrations.Migration):
    dependencies = [("core", "0004_lease")]

    operations = [migrations.RunPython(forwards, backwards)]
