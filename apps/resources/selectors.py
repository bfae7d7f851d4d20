"""Read queries shared by the API, the admin and later apps."""

import os
import pwd

from django.conf import settings
from django.db.models import Prefetch

from apps.backends.base import RunAs
from apps.core.exceptions import Forbidden, Unavailable
from apps.qrmi.selectors import unix_uid_for
from apps.resources.models import ResourceClass, ResourcePool


def visible_pools(user):
    """Pools the user may see and use (R-POOL-8), with their usage rows, classes and grants (no
    N+1)."""
    return (
        ResourcePool.objects.visible_to(user)
        .select_related("usage")
        .prefetch_related(
            Prefetch("classes", queryset=ResourceClass.objects.order_by("name", "id")),
            "users",
            "groups",
        )
        .order_by("name", "id")
    )


def visible_classes(user):
    return ResourceClass.objects.filter(pool__in=ResourcePool.objects.visible_to(user)).select_related("pool")


def can_use_pool(user, pool: ResourcePool) -> bool:
    return ResourcePool.objects.visible_to(user).filter(pk=pool.pk).exists()


def may_read_status(pool: ResourcePool, *, user=None, address: str | None = None) -> bool:
    """R-POOL-8 for the routes that answer without a login (``accessible``, QRMI's ``qpu-slots``
    and greeting): a public pool's status is anyone's; a private pool's only its users' (and
    staff's), or a load sensor's from ``GRIDGATE_LOAD_SENSOR_NETWORKS``. Anyone else gets the 404
    of a pool that does not exist: its name, capacity and use say who works on what."""
    if pool.public:
        return True
    if address and settings.GRIDGATE_LOAD_SENSOR_NETWORKS:
        import ipaddress

        try:
            client = ipaddress.ip_address(address)
        except ValueError:
            client = None
        if client is not None and any(
            client.version == network.version and client in network
            for network in settings.GRIDGATE_LOAD_SENSOR_NETWORKS
        ):
            return True
    return user is not None and user.is_authenticated and can_use_pool(user, pool)


#: :func:`run_as_for`'s ``uid`` when the caller did not read the user's link (it is read then)
LOOK_UP = object()


def run_as_for(user, pool: ResourcePool, *, uid=LOOK_UP) -> RunAs:
    """R-CASE-8: the Unix account ``user``'s local or Slurm cases on ``pool`` run as.

    The user's own linked account (the QRMI link, ``apps.qrmi.selectors``); else, where the pool
    allows it, the unprivileged sandbox account; a trusted (never public) pool runs as the
    service itself. Raises :class:`Forbidden` saying what to ask an operator, or
    :class:`Unavailable` when the host lacks the account the link names. ``uid``: the user's
    linked uid (or None) when the caller read it already (a list of pools reads it once).
    """
    if pool.trusted:
        if os.geteuid() != 0 and not settings.GRIDGATE_PRIVILEGED_COMMAND:
            return RunAs(RunAs.TRUSTED, network=pool.network, allowed_networks=egress(pool))
        # The service can switch accounts (it is root, or has the privileged helper's sudo rule):
        # a trusted pool's command then runs as the unprivileged sandbox account, never as root
        # or as the service itself, whose files (var/, the secret key) it could otherwise read.
        return _sandbox_account(pool)
    if uid is LOOK_UP:
        uid = unix_uid_for(user)
    if uid is not None:
        if uid == 0:
            raise Forbidden("Cases never run as root: ask an operator to link your Gridgate account to your own uid.")
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            raise Unavailable(
                f"Your linked Unix uid {uid} has no account on this host: ask an operator to create it "
                "or to correct the link (admin → Users → Unix account)."
            ) from None
        return RunAs(RunAs.OWNER, entry.pw_uid, entry.pw_gid, entry.pw_name, pool.network, egress(pool))
    if pool.sandbox_unlinked:
        return _sandbox_account(pool)
    raise Forbidden(
        f"Pool '{pool.name}' runs each case as its owner's Unix account and yours is not linked: ask an "
        "operator to link your Gridgate account to your Unix uid (admin → Users → Unix account).",
        code="unix_account_required",
    )


def _sandbox_account(pool: ResourcePool) -> RunAs:
    """The unprivileged sandbox account (``GRIDGATE_SANDBOX_USER``); never root, and never
    ``nobody`` as a stand-in (the privileged helper refuses the kernel's overflow account)."""
    name = settings.GRIDGATE_SANDBOX_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise Unavailable(
            f"Pool '{pool.name}' runs cases as the sandbox account '{name}', which does not exist "
            "on this host: ask an operator to create it (docs/operations.md)."
        ) from None
    if entry.pw_uid == 0:
        raise Unavailable("The sandbox account is root: an operator must set GRIDGATE_SANDBOX_USER.")
    return RunAs(RunAs.SANDBOX, entry.pw_uid, entry.pw_gid, entry.pw_name, pool.network, egress(pool))


def egress(pool: ResourcePool) -> tuple[str, ...]:
    """The networks a networked case of ``pool`` may reach past its egress filter."""
    try:
        return tuple(str(network) for network in pool.egress_exceptions())
    except ValueError:  # written around validation: nothing more than the filter's default
        return ()
