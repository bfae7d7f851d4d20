from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    # Issue 17: the tick loop and the worker heartbeat come from each worker's ticker process
    # (manage.py worker starts it; apps.core.ticker). A minutely loop beside it would be a second
    # loop, and a minutely heartbeat would make "heartbeat age" meaningless.
    remove_schedule(apps, name="gridgate.tick")
    remove_schedule(apps, name="gridgate.heartbeat")


def backwards(apps, schema_editor):
    ensure_schedule(apps, name="gridgate.tick", func="apps.core.tasks.tick", minutes=1)
    ensure_schedule(apps, name="gridgate.heartbeat", func="apps.core.tasks.heartbeat", minutes=1)


class Migration(migrations.Migration):
    dependencies = [("core", "0007_idempotencykey_locked_until")]

    operations = [migrations.RunPython(forwards, backwards)]
