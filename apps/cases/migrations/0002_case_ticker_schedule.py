from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    # Once a minute; each run loops for ~50 s running the passes every few seconds (R-CASE-2).
    ensure_schedule(apps, name="gridgate.cases.ticker", func="apps.cases.tasks.case_ticker", minutes=1)


def backwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.cases.ticker")


class Migration(migrations.Migration):
    dependencies = [
        ("cases", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
