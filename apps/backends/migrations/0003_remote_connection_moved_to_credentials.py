"""``RemoteConnection`` now belongs to the credentials app (its migration 0001): it leaves this
app's state only, its table stays where it is."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("backends", "0002_connection_provider_urls"),
        ("credentials", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="RemoteConnection")]),
    ]
