"""The token lookup every API request makes, written by hand (STYLE.md rule 4) beside its
pseudocode, tested directly (tests/accounts/test_tokens.py): built with the ORM, its compilation
cost more CPU than the rest of a floor request's authentication (docs/deployment.md, "Sizing")."""

from django.contrib.auth import get_user_model

from apps.accounts.models import ApiToken
from apps.core.rows import Columns, fetch_one

_TOKEN = Columns(ApiToken, "t")
_USER = Columns(get_user_model(), "u")


def token_with_user(digest: str) -> ApiToken | None:
    """The token stored under ``digest`` with its user, or None::

    SELECT token.*, user.* FROM token JOIN user ON user.id = token.user_id WHERE token.digest = digest

    ``token.*`` is every concrete column (``Columns``), ``last_used_at`` included: the
    authentication decides from it whether this request must record its use, without asking again.
    """
    found = fetch_one(
        f"SELECT {_TOKEN.sql}, {_USER.sql} FROM {ApiToken._meta.db_table} t"  # noqa: S608 (names from _meta)
        f" JOIN {get_user_model()._meta.db_table} u ON u.id = t.user_id WHERE t.digest = %s",
        [digest],
        _TOKEN,
        _USER,
    )
    if found is None:
        return None
    token, user = found
    token.user = user
    return token
