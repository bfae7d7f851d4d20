"""A password change revokes every API token of the user, from any path that changes it (the
admin's password forms, ``manage.py changepassword``, ``set_password()`` + ``save()`` in code).

``set_password()`` keeps the new raw password in ``_password`` until ``save()`` has run, and
``post_save`` fires inside that ``save()``: so ``_password`` tells a real change apart from a hash
upgrade at login (``check_password`` re-hashes with the current hasher, clears ``_password`` and
saves: the same password, tokens kept). Turning password login off (the admin's "disabled",
``set_unusable_password()``) leaves ``_password`` unset; it is seen as the stored hash turning
unusable since the row was loaded.
"""

from django.contrib.auth import get_user_model
from django.db.models.signals import post_init, post_save

from apps.accounts import services

_LOADED = "_gridgate_password_as_loaded"


def remember_loaded_password(sender, instance, **kwargs):
    # From __dict__: reading a deferred password field here would cost a query per instance.
    setattr(instance, _LOADED, instance.__dict__.get("password"))


def revoke_tokens_on_password_change(sender, instance, created, update_fields=None, **kwargs):
    stored = instance.__dict__.get("password")
    try:
        if created or (update_fields is not None and "password" not in update_fields):
            return
        changed = getattr(instance, "_password", None) is not None
        disabled = stored != getattr(instance, _LOADED, stored) and not instance.has_usable_password()
        if changed or disabled:
            services.revoke_tokens(instance)
    finally:
        setattr(instance, _LOADED, stored)


def connect():
    user_model = get_user_model()
    post_init.connect(remember_loaded_password, sender=user_model, dispatch_uid="accounts.remember_password")
    post_save.connect(revoke_tokens_on_password_change, sender=user_model, dispatch_uid="accounts.revoke_tokens")
