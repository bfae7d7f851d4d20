from django.core.management.base import BaseCommand

from apps.sessions.services import expire_due_sessions


class Command(BaseCommand):
    help = "Revoke sessions past their lifetime, or idle with no pending or running job (R-SESS-3)."

    def add_arguments(self, parser):
        parser.add_argument("--pool", type=int, help="Only this pool id.")

    def handle(self, *args, pool=None, **options):
        counts = expire_due_sessions(pool_id=pool)
        self.stdout.write(
            f"expired {counts['max_lifetime']} session(s) past max_lifetime, {counts['idle_timeout']} idle session(s)"
        )
