"""``manage.py recompute_usage [pool …]``: rebuild usage_fair pools' decayed usage from their job
history (R-SCHED-6), e.g. after changing a pool's half-life or its ``share_by``."""

import time

from django.core.management.base import BaseCommand, CommandError

from apps.resources.models import ResourcePool
from apps.scheduling import shares


class Command(BaseCommand):
    help = "Rebuild the decayed device time of usage_fair pools' users or groups from their job history."

    def add_arguments(self, parser):
        parser.add_argument("pools", nargs="*", help="Pool names (default: every usage_fair pool).")

    def handle(self, *args, pools, **options):
        queryset = ResourcePool.objects.filter(strategy="usage_fair")
        if pools:
            queryset = ResourcePool.objects.filter(name__in=pools)
            missing = set(pools) - set(queryset.values_list("name", flat=True))
            if missing:
                raise CommandError(f"No such pool: {', '.join(sorted(missing))}.")
        for pool in queryset.order_by("name"):
            counted = shares.recompute(pool, time.time())
            self.stdout.write(f"{pool.name}: usage rebuilt from {counted} job(s).")
