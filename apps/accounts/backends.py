"""Local passwords, as GRIDGATE_PASSWORD_LOGIN allows them.

One rule for every password path: the user pages' login, the admin's, and the token endpoint
(``services.log_in``) all authenticate through this backend. ``user_can_authenticate`` is also
what restores a password session on each request (``get_user``), so switching passwords off
(or to staff only) ends the sessions that no longer qualify at their next request.
"""

from django.conf import settings
from django.contrib.auth.backends import ModelBackend


def password_allowed(user) -> bool:
    mode = settings.GRIDGATE_PASSWORD_LOGIN
    return mode == "on" or (mode == "staff" and (user.is_staff or user.is_superuser))


class PasswordBackend(ModelBackend):
    def user_can_authenticate(self, user):
        return super().user_can_authenticate(user) and password_allowed(user)
