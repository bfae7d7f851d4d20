from django.db import migrations

# A job submission renews its session's idle deadline, an update no index sees, which PostgreSQL
# makes in place (a HOT update, no index written) only when the row's page has room for the new
# version. Filled pages (the default fillfactor, 100) left a session inserted into one to write
# every index of the table at each submission until the row moved; 80 keeps a fifth of each page
# for the renewals. Existing pages change as rows are written again; SQLite has no such setting.


def leave_room(apps, schema_editor, fillfactor=80):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE compute_sessions_session SET (fillfactor = {int(fillfactor)})")


def fill(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE compute_sessions_session RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("compute_sessions", "0009_session_spends_an_allocation")]

    operations = [migrations.RunPython(leave_room, fill)]
