from django.db import migrations

from apps.core.schedules import ensure_schedule, remove_schedule


def forwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.cases.ticker")  # now a pass of the shared gridgate.tick


def backwards(apps, schema_editor):
    ensure_schedule(apps, name="gridgate.cases.ticker", func="apps.cases.tasks.case_ticker", minutes=1)


class Migration(migrations.Migration):
    dependencies = [("cases", "0002_case_ticker_schedule"), ("core", "0006_tick_schedule")]

    operations = [migrations.RunPython(forwards, backwards), migrations.DeleteModel(name="PassLease")]
