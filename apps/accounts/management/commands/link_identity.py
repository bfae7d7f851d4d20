"""``manage.py link_identity USERNAME SUBJECT``: the identity provider's subject becomes that user
here (docs/identity.md). For a local account whose first sign-in was refused (its username was
taken), a user whose provider username is refused here, or a service account signing in with the
client credentials grant (``--create`` makes its user)."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.accounts.models import Identity


class Command(BaseCommand):
    help = "Link an identity at the identity provider (issuer, subject) to a user."

    def add_arguments(self, parser):
        parser.add_argument("username", help="the user here")
        parser.add_argument("subject", help="the provider's sub claim (its user page, or a token's sub)")
        parser.add_argument("--issuer", default=None, help="default: GRIDGATE_OIDC_ISSUER")
        parser.add_argument("--note", default="", help="why, for the next operator (e.g. 'SPANK plugin client')")
        parser.add_argument("--create", action="store_true", help="create the user (a service account) if missing")

    def handle(self, *args, username, subject, issuer, note, create, **options):
        issuer = (issuer or settings.GRIDGATE_OIDC_ISSUER).rstrip("/")
        if not issuer:
            raise CommandError("No issuer: set GRIDGATE_OIDC_ISSUER or pass --issuer.")
        User = get_user_model()  # noqa: N806
        with transaction.atomic():
            user = User.objects.filter(username=username).first()
            if user is None:
                if not create:
                    raise CommandError(f"No user {username!r} (pass --create to make one, e.g. for a service account).")
                user = User.objects.create_user(username)  # no password: it signs in with the provider only
                user.full_clean(exclude=["password"])
            taken = Identity.objects.select_for_update().filter(issuer=issuer, subject=subject).first()
            if taken is not None and taken.user_id != user.pk:
                raise CommandError(
                    f"Subject {subject!r} at {issuer} is already {taken.user}'s: remove that identity first "
                    "(admin → Identities) if it is to move."
                )
            identity, created = Identity.objects.get_or_create(
                issuer=issuer, subject=subject, defaults={"user": user, "note": note[:200]}
            )
        verb = "linked" if created else "was already linked"
        self.stdout.write(f"{subject} at {issuer} {verb} to {user.username}.")
