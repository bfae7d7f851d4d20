"""A pool's jobs are indexed by (pool, created_at) in place of the pool column's own index: the
same lookups by pool, plus the range of jobs submitted lately (the ETA's arrival rates), and no
extra index to write on each submission. The new index is built before the old one is dropped."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("resources", "0008_usage_fair_shares"),
        ("scheduling", "0016_usage_fair_shares"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["pool", "created_at"], name="jobs_pool_created"),
        ),
        migrations.AlterField(
            model_name="job",
            name="pool",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="jobs",
                to="resources.resourcepool",
            ),
        ),
    ]
