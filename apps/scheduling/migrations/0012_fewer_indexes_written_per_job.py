import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# Fewer index writes per submission: every job inserted wrote an entry into each index of the table. The user column's own
# index duplicated jobs_user_created; device and target_device are NULL when a job is submitted
# (and target_device for most jobs ever), so their indexes become partial, without those rows.
# The foreign keys keep their constraints: only their indexes change (AlterField would drop and
# re-add each constraint, re-checking every job under an exclusive lock).

# (column, Django's name for the column's index as created by 0001_initial)
OLD_INDEXES = [
    ("device_id", "scheduling_job_device_id_edbcb6e9"),
    ("target_device_id", "scheduling_job_target_device_id_49fa4e93"),
    ("user_id", "scheduling_job_user_id_dc38b1af"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("compute_sessions", "0005_fewer_indexes_written_per_submission"),
        ("resources", "0002_pool_run_as_settings"),
        ("scheduling", "0011_job_lease_owner"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="device",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="jobs",
                        to="scheduling.device",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="target_device",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        help_text="Run only on this device (else any online device of the pool).",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="targeted_jobs",
                        to="scheduling.device",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="jobs",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(f"DROP INDEX IF EXISTS {name}", f"CREATE INDEX {name} ON scheduling_job ({column})")
                for column, name in OLD_INDEXES
            ],
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(condition=models.Q(("device__isnull", False)), fields=["device"], name="jobs_device"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("target_device__isnull", False)),
                fields=["target_device"],
                name="jobs_target_device",
            ),
        ),
    ]
