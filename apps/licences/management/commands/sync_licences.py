"""``manage.py sync_licences [--dry-run] [--pool NAME]``: bring the Slurm licences of the pools
in line now, or show what that would do (docs/qrmi.md, "Slurm licences").

On a host of the Slurm controller, run it every minute from cron or a systemd timer as the
fail-closed guard: when Gridgate's database cannot be reached it sets every licence Gridgate
made to 0 (and exits 1), so Slurm starts no job whose acquire could not be answered.
"""

import sys

from django.core.management.base import BaseCommand
from django.db import DatabaseError

from apps.licences import passes, sacctmgr, scontrol
from apps.licences.models import LicenceState
from apps.licences.sacctmgr import Licence, SlurmError
from apps.resources.models import ResourcePool


class Command(BaseCommand):
    help = "Sync each pool's Slurm licence count with its free slots (or show what would change with --dry-run)."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Show the wanted and current counts only.")
        parser.add_argument("--pool", help="Only this pool (by name).")

    def handle(self, *args, dry_run=False, pool=None, **options):
        try:
            pools = ResourcePool.objects.exclude(slurm_licence="").order_by("name")
            if pool:
                pools = pools.filter(name=pool)
            pools = list(pools)
        except DatabaseError as exc:
            self.stderr.write(f"Gridgate's database cannot be reached: {exc}")
            if dry_run:
                names = ", ".join(str(licence) for licence in sacctmgr.ours()) or "none"
                self.stdout.write(f"would close (count 0) every licence Gridgate made: {names}")
            else:
                closed = passes.close_all(f"sync_licences: the database cannot be reached ({exc})")
                self.stdout.write(f"closed (count 0): {', '.join(closed) or 'none'}")
            sys.exit(1)
        if not pools:
            self.stdout.write("no pool has a Slurm licence" + (f" named {pool!r}" if pool else ""))
            return
        failed = 0
        for each in pools:
            count, reason = passes.wanted(each)
            try:
                current = sacctmgr.count(Licence.parse(each.slurm_licence))
            except SlurmError as exc:
                self.stdout.write(self.style.ERROR(f"{each.name}: {each.slurm_licence}: {exc}"))
                failed += 1
                continue
            have = "missing" if current is None else str(current)
            line = f"{each.name}: {each.slurm_licence}: Slurm has {have}, wanted {count} ({reason})"
            if dry_run:
                self.stdout.write(line)
                failed += self._show_reservations(each, count)
                continue
            outcome = passes.sync_pool(each.pk)
            failed += outcome == "failed"
            self.stdout.write(f"{line}: {outcome}")
        if failed:
            sys.exit(1)

    def _show_reservations(self, pool, count: int) -> int:
        """--dry-run: each window's Slurm reservation (R-RES-3), as wanted and as Slurm has it."""
        wanted = passes.wanted_reservations(pool, count)
        state = LicenceState.objects.filter(pool=pool).first()
        if not wanted and not (state and state.reservations):
            return 0
        try:
            present = scontrol.present()
        except SlurmError as exc:
            self.stdout.write(self.style.ERROR(f"{pool.name}: reservations: {exc}"))
            return 1
        for want in wanted:
            have = present.get(want.name)
            when = f"{want.start:%Y-%m-%d %H:%M}-{want.end:%Y-%m-%d %H:%M}"
            shown = f"{want.name} {when} {want.licences} users={','.join(want.users)}"
            if have is None:
                verdict = "missing: would create"
            elif scontrol.differs(want, have):
                verdict = (
                    f"differs (Slurm has {have.licences} users={','.join(have.users)} until {have.end}): would change"
                )
            else:
                verdict = "in step"
            self.stdout.write(f"{pool.name}: reservation {shown}: {verdict}")
        for name in sorted(set(state.reservations if state else ()) - {want.name for want in wanted}):
            if name in present:
                self.stdout.write(f"{pool.name}: reservation {name}: no longer wanted: would remove")
        return 0
