"""The one user ↔ Unix account link of the product (R-QRMI-2, R-CASE-8).

QRMI maps a MUNGE uid to its user with :func:`user_for_uid`; the local and Slurm backends run a
user's cases as the account :func:`unix_uid_for` names (through
``apps.resources.selectors.run_as_for``). Operators edit the link on the user's admin page.
"""

from apps.qrmi.models import UnixAccount
from apps.qrmi.statements import active_user_for_uid


def user_for_uid(uid: int):
    """The active user linked to Unix ``uid``, or None (one statement: every QRMI request asks)."""
    return active_user_for_uid(uid)


def unix_uid_for(user) -> int | None:
    """The Unix uid linked to ``user``, or None when the user has no linked account."""
    return UnixAccount.objects.filter(user_id=user.pk).values_list("unix_uid", flat=True).first()


def uids_of(user_ids) -> dict[int, int]:
    """``{user id: linked Unix uid}`` for those of ``user_ids`` that have one (one query)."""
    return dict(UnixAccount.objects.filter(user_id__in=list(user_ids)).values_list("user_id", "unix_uid"))
