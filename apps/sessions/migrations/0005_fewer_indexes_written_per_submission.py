import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# Fewer index writes per submission: a job submission renews its session's idle deadline; with idle_expires_at in an index,
# every renewal wrote a new entry into each of the table's 11 indexes instead of updating the row
# in place (PostgreSQL's HOT update). The user column's own index duplicated sessions_user_created.
# The foreign key keeps its constraint: only its index goes (AlterField would drop and re-add the
# constraint, re-checking every row of the table under an exclusive lock).


class Migration(migrations.Migration):
    dependencies = [
        ("compute_sessions", "0004_session_sessions_created"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="session",
            name="sessions_active_idle",
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="session",
                    name="user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="compute_sessions",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS compute_sessions_session_user_id_51c8549e",
                    "CREATE INDEX compute_sessions_session_user_id_51c8549e ON compute_sessions_session (user_id)",
                ),
            ],
        ),
    ]
