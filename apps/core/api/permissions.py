from rest_framework.permissions import SAFE_METHODS, BasePermission

WRITE_ACTIONS = {"POST": "add", "PUT": "change", "PATCH": "change", "DELETE": "delete"}


def model_permission(model, action: str) -> str:
    """Django's permission name for ``action`` (add, change, delete) on ``model``."""
    return f"{model._meta.app_label}.{action}_{model._meta.model_name}"


class StaffWithModelPermissionOrReadOnly(BasePermission):
    """Reads for any authenticated user (views scope the queryset); writes for staff who hold the
    model's Django permission (add, change or delete; a superuser holds them all), exactly as the
    admin asks. Being staff is not enough: pools, classes and devices name the credentials the
    service sends and where it sends them, so operators grant that to whom they choose (admin →
    Users or Groups → permissions). A view may ask for more through ``write_permissions(request)``
    (a pool PATCH that also edits its classes)."""

    message = "You need staff status and the permission to change this (ask an operator)."

    def has_permission(self, request, view):
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if request.method in SAFE_METHODS:
            return True
        if not user.is_staff:
            return False
        if hasattr(view, "write_permissions"):
            wanted = view.write_permissions(request)
        else:
            wanted = [model_permission(view.get_queryset().model, WRITE_ACTIONS.get(request.method, "change"))]
        return user.has_perms(wanted)


class IsStaff(BasePermission):
    message = "Only staff may do this."

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)
