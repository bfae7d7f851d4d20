"""Upgrade from the single-host era (before several worker hosts): pin unfinished local cases to this host.

0007 added ``run_host`` empty for every case. An unfinished local case from before runs as a
process on the one worker host there was; left unpinned, any new worker host could claim it,
find no process in its own /proc and fail it while it still runs. The host that runs this
migration is taken to be that host (``GRIDGATE_WORKER_HOST``; docs/operations.md, "Upgrading
to several hosts"): run ``migrate`` there, or with its identity set.
"""

from django.conf import settings
from django.db import migrations
from django.db.models import Q

#: backends whose case is a process on one worker host (``host_bound``), by the name recorded in
#: ``Case.backend`` at launch. Frozen here: a migration must not follow later registry changes.
HOST_BOUND_BACKENDS = ["local"]


def pin_unfinished_local_cases(apps, schema_editor):
    Case = apps.get_model("cases", "Case")
    host = settings.GRIDGATE_WORKER_HOST[: Case._meta.get_field("run_host").max_length]
    # Unfinished: submitted (pending, running) or launched and not yet submitted ("submitting":
    # prepared with a launch request; a worker killed mid-submit may have started its process).
    unfinished = Q(status__in=["pending", "running"]) | Q(status="prepared", launch_requested_at__isnull=False)
    Case.objects.filter(unfinished, backend__in=HOST_BOUND_BACKENDS, run_host="").update(run_host=host)


class Migration(migrations.Migration):
    dependencies = [
        ("cases", "0007_case_run_host"),
    ]

    operations = [
        # Nothing to undo: unapplying 0007 drops the column.
        migrations.RunPython(pin_unfinished_local_cases, migrations.RunPython.noop),
    ]
