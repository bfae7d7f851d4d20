"""Rolling windows saved longer than a century (before the form refused them, e.g. a year in
seconds typed as days) end past year 9999: every reading of their period raised OverflowError (the
allocation list, admission, the dispatcher). They are clamped to a century, which reads the same:
the grant's first window, the one it is in and whose spending it counts, lasts until its start
plus 100 years either way. The next migration adds the constraint that keeps them so."""

from django.db import migrations

MAX_WINDOW_DAYS = 36_525  # apps.allocations.models.MAX_WINDOW_DAYS as of this migration


def clamp_rolling_windows(apps, schema_editor):
    Allocation = apps.get_model("allocations", "Allocation")
    Allocation.objects.filter(window_days__gt=MAX_WINDOW_DAYS).update(window_days=MAX_WINDOW_DAYS)


class Migration(migrations.Migration):
    dependencies = [("allocations", "0002_charges_protect_their_pool_and_allocation")]

    operations = [migrations.RunPython(clamp_rolling_windows, migrations.RunPython.noop, elidable=True)]
