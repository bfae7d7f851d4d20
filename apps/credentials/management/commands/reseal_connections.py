"""``manage.py reseal_connections``: re-seal every stored per-user credential (and every
notification webhook's signing secret) under the first key of ``GRIDGATE_CREDENTIALS_KEY``, the
middle step of a key rotation (``apps.credentials.sealing``).

Each connection is re-sealed under its row lock (a worker storing a rotated refresh token meanwhile
waits, and its value is never overwritten with an older one). A value no configured key opens is
reported by id and left as it is; the exit status is then 1 (those users reconnect). Nothing
secret is printed.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.credentials import sealing
from apps.credentials.models import RemoteConnection
from apps.notifications.models import Subscription


class Command(BaseCommand):
    help = "Re-seal every stored per-user credential under the first key of GRIDGATE_CREDENTIALS_KEY."

    def handle(self, *args, **options):
        try:
            sealing.require()
        except sealing.SealingUnavailable as exc:
            raise CommandError(exc.detail) from None
        resealed, unreadable = reseal(RemoteConnection.objects.all(), "sealed_secret", also=["updated_at"])
        self.stdout.write(f"re-sealed {resealed} connection(s) under the first key")
        hooks, unreadable_hooks = reseal(Subscription.objects.exclude(secret_sealed=""), "secret_sealed")
        self.stdout.write(f"re-sealed {hooks} webhook secret(s) under the first key")
        if unreadable_hooks:
            ids = ", ".join(map(str, unreadable_hooks))
            self.stderr.write(
                f"{len(unreadable_hooks)} webhook secret(s) cannot be opened with any configured key (subscriptions "
                f"{ids}): their users must create those webhooks again"
            )
        if unreadable:
            ids = ", ".join(map(str, unreadable))
            raise CommandError(
                f"{len(unreadable)} connection(s) cannot be opened with any configured key (ids {ids}): "
                "their users must reconnect (or put the key they were sealed with back into GRIDGATE_CREDENTIALS_KEY)"
            )
        if unreadable_hooks:
            raise CommandError("some webhook secrets cannot be opened with any configured key (above)")


def reseal(rows, field: str, also=()) -> tuple[int, list[int]]:
    """Re-seal ``field`` of each of ``rows`` under the first key, one short transaction a row (a
    row deleted meanwhile is skipped); returns how many, and the ids no configured key opens."""
    resealed, unreadable = 0, []
    for pk in rows.order_by("pk").values_list("pk", flat=True).iterator():
        with transaction.atomic():
            row = rows.model.objects.select_for_update().filter(pk=pk).first()
            if row is None:
                continue  # disconnected or unsubscribed meanwhile
            try:
                setattr(row, field, sealing.reseal(getattr(row, field)))
            except sealing.Unreadable:
                unreadable.append(pk)
                continue
            row.save(update_fields=[field, *also])
            resealed += 1
    return resealed, unreadable
