from rest_framework.permissions import BasePermission

from apps.qrmi.munge import MungeIdentity


class HasMungeIdentity(BasePermission):
    """R-QRMI-2: every QRMI route but ``accessible`` needs a verified MUNGE credential."""

    message = "A MUNGE credential (X-Munge-Cred) is required."

    def has_permission(self, request, view):
        return isinstance(request.auth, MungeIdentity)
