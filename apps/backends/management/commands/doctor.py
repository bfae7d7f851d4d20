"""``manage.py doctor [--backend NAME] [--pool ID]`` (R-BACK-5).

One line per check with an actionable message; credentials are reported present or missing,
never printed. Exit status 1 when any check fails, so it can gate a deployment.
"""

import sys

from django.core.management.base import BaseCommand, CommandError

from apps.backends import registry
from apps.backends.base import Check
from apps.backends.remote_common import scrub_for_pool
from apps.resources.models import ResourcePool


class Command(BaseCommand):
    help = "Check that the execution backends can run cases (one line per check; non-zero exit on failure)."

    def add_arguments(self, parser):
        parser.add_argument("--backend", help=f"Only this backend ({', '.join(sorted(registry.BACKENDS))}).")
        parser.add_argument("--pool", type=int, help="Only this pool (by id), with its backend.")

    def targets(self, backend_name, pool_id):
        """(backend name, pool or None) pairs to check."""
        if backend_name and backend_name not in registry.BACKENDS:
            raise CommandError(f"Unknown backend {backend_name!r}; registered: {', '.join(sorted(registry.BACKENDS))}.")
        if pool_id is not None:
            pool = ResourcePool.objects.filter(pk=pool_id).first()
            if pool is None:
                raise CommandError(f"No pool with id {pool_id}.")
            if backend_name:
                return [(backend_name, pool)]
            try:
                return [(registry.backend_name_for_kind(pool.kind), pool)]
            except registry.NoBackend as exc:
                raise CommandError(str(exc)) from None
        mapping = registry.kind_map()
        names = [backend_name] if backend_name else sorted(set(mapping.values()))
        out = []
        for name in names:
            kinds = [kind for kind, served_by in mapping.items() if served_by == name]
            pools = list(ResourcePool.objects.filter(kind__in=kinds).order_by("name", "id"))
            out += [(name, pool) for pool in pools] or [(name, None)]
        return out

    def site_checks(self) -> list:
        """The cases root is 0711, closed to other accounts, and every live worker host sees the
        same one, whatever the backend. Remote backends' cases are polled and finalized by any
        host; a local case's inputs are written and its logs and results served by the web
        processes, and a launch not yet pinned is submitted by any worker host. One host alone
        passes: it sees its own marker."""
        from apps.core.cases_root import cases_root_check, space_check
        from apps.core.hosts import shared_root_check

        # Before any backend's check: those create a missing root with the umask's mode.
        checks = [
            Check("cases root", *cases_root_check()),
            Check("cases root shared", *shared_root_check()),
            Check("cases root space", *space_check()),
        ]
        if ResourcePool.objects.exclude(slurm_licence="").exists():
            from apps.licences import sacctmgr
            from apps.licences.passes import calendar_check

            # Pools with a Slurm licence: their counts are set through slurmdbd (docs/qrmi.md).
            checks.append(Check("slurm licences", *sacctmgr.check()))
            checks.append(Check("slurm reservations (the QPU calendar)", *calendar_check()))
        return checks

    def _report_check(self, label: str, check) -> bool:
        """One check's line (``OK`` or ``FAIL``, under ``label``); returns whether it passed."""
        if check.ok:
            self.stdout.write(f"OK    [{label}] {check.name}: {check.message}")
        else:
            self.stdout.write(self.style.ERROR(f"FAIL  [{label}] {check.name}: {check.message}"))
        return bool(check.ok)

    def handle(self, *args, backend=None, pool=None, **options):
        targets = self.targets(backend, pool)  # a wrong --backend or --pool stops before any line
        passed = [self._report_check("site", check) for check in self.site_checks()]  # one entry per check
        for name, target_pool in targets:
            label = name + (f" pool={target_pool.name}" if target_pool is not None else "")
            try:
                checks = registry.get_backend(name).doctor(target_pool)
            except Exception as exc:  # a doctor must report, not crash
                text = scrub_for_pool(target_pool, f"{type(exc).__name__}: {exc}")  # R-BACK-1
                checks = [Check("doctor", False, f"the check itself failed: {text}")]
            for check in checks:
                check.message = scrub_for_pool(target_pool, check.message)
                passed.append(self._report_check(label, check))
        summary = f"{sum(passed)}/{len(passed)} checks passed"
        if not all(passed):
            self.stdout.write(self.style.ERROR(summary))
            sys.exit(1)
        self.stdout.write(self.style.SUCCESS(summary))
