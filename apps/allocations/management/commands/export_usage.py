"""``manage.py export_usage --month 2026-11 [--group-by user|group|project|pool] [--format csv|json]``:
R-ACCT-1's export from the command line (the same rows as ``GET /api/v1/accounting/usage/``)."""

import json

from django.core.management.base import BaseCommand, CommandError

from apps.allocations.usage import GROUP_BY, PERIODS, as_csv, month_bounds, usage


class Command(BaseCommand):
    help = "Export usage (the charges) per user, group, project or pool for one month, as CSV or JSON."

    def add_arguments(self, parser):
        parser.add_argument("--month", required=True, help="YYYY-MM, e.g. 2026-11.")
        parser.add_argument("--group-by", default="user", choices=list(GROUP_BY))
        parser.add_argument("--period", default="month", choices=list(PERIODS))
        parser.add_argument("--format", default="csv", choices=["csv", "json"])

    def handle(self, *args, **options):
        try:
            since, until = month_bounds(options["month"])
        except (ValueError, OverflowError):
            raise CommandError("--month must be YYYY-MM, e.g. 2026-11.") from None
        rows = usage(since=since, until=until, group_by=options["group_by"], period=options["period"])
        if options["format"] == "json":
            self.stdout.write(json.dumps({"since": since.isoformat(), "until": until.isoformat(), "rows": rows}))
        else:
            self.stdout.write(as_csv(rows), ending="")
