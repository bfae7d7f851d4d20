from django.core.management.base import BaseCommand

from apps.sessions.services import expire_due_sessions, recount_usage


class Command(BaseCommand):
    help = (
        "Revoke sessions past their lifetime, or idle with no pending or running job (R-SESS-3), then check "
        "every pool's usage counters against its active sessions and repair any drift (R-SESS-1)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--pool", type=int, help="Only expire this pool id's sessions.")

    def handle(self, *args, pool=None, **options):
        counts = expire_due_sessions(pool_id=pool)
        self.stdout.write(
            f"expired {counts['max_lifetime']} session(s) past max_lifetime, {counts['idle_timeout']} idle session(s)"
        )
        repaired = recount_usage()
        if repaired:
            self.stdout.write(f"repaired the usage counters of {len(repaired)} pool(s): {', '.join(repaired)}")
