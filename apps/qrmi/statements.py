"""The uid lookup every MUNGE-authenticated request makes, written by hand (STYLE.md rule 4)
beside its pseudocode, tested directly (tests/qrmi/test_munge_auth.py): as the API token's
(``apps.accounts.statements``), the ORM's compilation of it cost more CPU than running it."""

from django.contrib.auth import get_user_model

from apps.core.rows import Columns, fetch_one
from apps.qrmi.models import UnixAccount

_USER = Columns(get_user_model(), "u")


def active_user_for_uid(uid: int):
    """The active user linked to Unix ``uid``, or None::

    SELECT user.* FROM unix account JOIN user ON user.id = account.user_id
     WHERE account.unix_uid = uid AND user.is_active
    """
    found = fetch_one(
        f"SELECT {_USER.sql} FROM {UnixAccount._meta.db_table} a"  # noqa: S608 (names from _meta)
        f" JOIN {get_user_model()._meta.db_table} u ON u.id = a.user_id WHERE a.unix_uid = %s AND u.is_active",
        [uid],
        _USER,
    )
    return None if found is None else found[0]
