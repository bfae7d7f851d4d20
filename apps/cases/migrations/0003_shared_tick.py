from django.db import migrations

from apps.core.schedules import remove_schedule


def forwards(apps, schema_editor):
    remove_schedule(apps, name="gridgate.cases.ticker")  # now a pass of the shared gridgate.tick


# No backwards step: recreating the old schedule would point at apps.cases.tasks.case_ticker,
# which no longer exists (a failing task every minute); the shared tick runs the passes.


class Migration(migrations.Migration):
    dependencies = [("cases", "0002_case_ticker_schedule"), ("core", "0006_tick_schedule")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop), migrations.DeleteModel(name="PassLease")]
