from django.db import migrations

from apps.core.schedules import remove_schedule


def forwards(apps, schema_editor):
    # Several worker hosts: the tick loop and the worker heartbeat come from each worker's ticker process
    # (manage.py worker starts it; apps.core.ticker). A minutely loop beside it would be a second
    # loop, and a minutely heartbeat would make "heartbeat age" meaningless.
    remove_schedule(apps, name="gridgate.tick")
    remove_schedule(apps, name="gridgate.heartbeat")


class Migration(migrations.Migration):
    dependencies = [("core", "0007_idempotencykey_locked_until")]

    # The reverse recreates nothing: the minutely loop's task (apps.core.tasks.tick) is gone, and
    # a schedule calling it would fail every minute; the ticker process runs the loop instead.
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
