"""The login forms of the user pages and the admin, saying so when django-axes refused the attempt
instead of "wrong password" (which would send a person to retype it, in vain)."""

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from apps.accounts import lockout


class LockoutMessageMixin:
    #: Set when the error is the lockout: the page shows it instead of its own wording.
    locked_out = False

    def get_invalid_login_error(self):
        if lockout.is_locked_out(self.request):
            self.locked_out = True
            return ValidationError(lockout.lockout_message(self.request), code="locked_out")
        return super().get_invalid_login_error()


class LoginForm(LockoutMessageMixin, AuthenticationForm):
    """The user pages' login (apps/web/urls.py)."""


class AdminLoginForm(LockoutMessageMixin, AdminAuthenticationForm):
    """The admin's login (``admin.site.login_form``, set in apps/accounts/admin.py)."""
