from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    ensure_schedule(apps, name="gridgate.heartbeat", func="apps.core.tasks.heartbeat", minutes=1)


def backwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.heartbeat")


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
