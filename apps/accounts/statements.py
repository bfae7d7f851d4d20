"""The lookups every API request makes (a static token's, a bearer JWT's identity), written by
hand (STYLE.md rule 4) beside their pseudocode, tested directly (tests/accounts/test_tokens.py,
test_oidc.py): built with the ORM, their compilation cost more CPU than the rest of a floor
request's authentication (docs/deployment.md, "Sizing")."""

from django.contrib.auth import get_user_model

from apps.accounts.models import ApiToken, Identity
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


def identity_user(issuer: str, subject: str):
    """The user whose identity at ``issuer`` is ``subject``, or None::

    SELECT user.* FROM identity JOIN user ON user.id = identity.user_id
     WHERE identity.issuer = issuer AND identity.subject = subject

    (one row at most: the pair is unique). Built with the ORM, this join's compilation made a
    bearer request dearer than a static token's (docs/identity.md §3).
    """
    found = fetch_one(
        f"SELECT {_USER.sql} FROM {Identity._meta.db_table} i"  # noqa: S608 (names from _meta)
        f" JOIN {get_user_model()._meta.db_table} u ON u.id = i.user_id WHERE i.issuer = %s AND i.subject = %s",
        [issuer, subject],
        _USER,
    )
    return None if found is None else found[0]
