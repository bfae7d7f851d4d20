from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.scheduling_tick")  # now a pass of the shared gridgate.tick


def backwards(apps, schema_editor):
    ensure_schedule(apps, name="gridgate.scheduling_tick", func="apps.scheduling.tasks.tick", minutes=1)


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0003_driverrun_times"), ("core", "0006_tick_schedule")]

    operations = [migrations.RunPython(forwards, backwards)]
