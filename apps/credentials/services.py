"""Per-user remote credentials: connecting, the identity a case's calls run under, refreshing,
disconnecting (docs/backends.md, "Per-user credentials", which tells the flows).

What differs by provider is its session class's (``apps.backends.remote.provider``: ``url_keys``,
``paste``, ``account_of``). The backend only gets a :class:`~apps.backends.base.RemoteIdentity`
and never sees the database or a sealed value. Access tokens are never stored: each process keeps
the ones it obtained in memory (``_access_tokens``) until a minute before they expire.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from functools import partial

from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from apps.accounts.models import Identity
from apps.backends.base import BackendError, CredentialsRequired, RemoteIdentity
from apps.backends.remote import provider
from apps.core.exceptions import Forbidden, Invalid, NotFound, Unavailable
from apps.credentials import oauth, sealing
from apps.credentials.models import ConnectionState, RemoteConnection
from apps.resources.models import ResourcePool
from apps.resources.remote import SERVICE, USER, credential_mode

logger = logging.getLogger(__name__)

_access_tokens: dict[tuple[int, int], tuple[str, float]] = {}  # (connection, generation) → (token, expiry)
_access_lock = threading.Lock()


def connect_page() -> str:
    """The path of the page where a user (re)connects: named in every message that asks them to."""
    try:
        return reverse("web:connection-list")
    except NoReverseMatch:  # the user pages are not mounted (an API-only deployment)
        return "/connections/"


def needs_user_credentials(pool) -> bool:
    """Whether ``pool`` runs each case under its owner's own credential."""
    return credential_mode(pool.kind, pool.remote) == USER


def provider_urls(pool) -> dict:
    """Where ``pool`` sends its users' credentials (its provider's ``url_keys``; a missing one as
    None). A connection remembers them and is never used once they differ (:func:`moved`): whoever
    may change a pool must not redirect the credentials its users already connected elsewhere."""
    remote = pool.remote or {}
    session = provider(pool.kind)
    return {key: remote.get(key) for key in (session.url_keys if session else ())}


def moved(connection: RemoteConnection, pool) -> str:
    """The provider URLs of ``pool`` that changed since ``connection`` was made, in words ("" if
    none): the connection is then not used, and the user reconnects."""
    now = provider_urls(pool)
    return ", ".join(key for key in now if (connection.provider_urls or {}).get(key) != now[key])


def note_provider_url_change(*, pool, before: dict, actor) -> int:
    """After a pool was saved: if its provider URLs changed and users had connected to it, their
    connections are marked failed (they reconnect, to the new provider, knowingly) and the change,
    old and new URLs, goes into the pool's admin history under ``actor``. Returns how many
    connections were ended."""
    after = provider_urls(pool)
    if before == after:
        return 0
    changed = {key: (before.get(key), after[key]) for key in after if before.get(key) != after[key]}
    failure = f"the pool's provider URLs changed ({', '.join(changed)})"
    now = timezone.now()
    ended = RemoteConnection.objects.filter(pool=pool, state=ConnectionState.CONNECTED).update(
        state=ConnectionState.FAILED, failed_at=now, failure=failure, updated_at=now
    )
    if getattr(actor, "pk", None):
        message = "Provider URLs changed: " + "; ".join(f"{key} {old} → {new}" for key, (old, new) in changed.items())
        if ended:
            message += f"; {ended} user connection(s) must reconnect"
        LogEntry.objects.log_actions(
            user_id=actor.pk, queryset=[pool], action_flag=CHANGE, change_message=message, single_object=True
        )
    if ended:
        logger.warning("pool %s moved to other provider URLs: %d connection(s) must reconnect", pool.pk, ended)
    return ended


def _reconnect(user, pool, why: str) -> str:
    return f"{user.username}'s connection to pool '{pool.name}' {why}: reconnect at {connect_page()}"


# -- the identity a case's provider calls run under -----------------------------------------------
def identity_for(user, pool, connections: dict | None = None) -> RemoteIdentity | None:
    """``user``'s identity on ``pool`` (one query on a per-user pool, none otherwise; none either
    when ``connections``, {(user id, pool id): row}, holds the rows already read); None for pools
    whose kind uses no provider credential."""
    mode = credential_mode(pool.kind, pool.remote)
    if mode is None:
        return None
    if mode == SERVICE:
        # a service-account job records the credential's variable name, never a value
        names = provider(pool.kind)(pool.remote_config()).service_env_names()
        label = f"service account ({names[0] if names else pool.kind})"
        return RemoteIdentity(RemoteIdentity.SERVICE, label, key="service")
    if connections is None:
        connection = RemoteConnection.objects.filter(user=user, pool=pool).first()
    else:
        connection = connections.get((user.pk, pool.pk))
    return _user_identity(user, pool, connection)


def connected_identity(user, pool) -> RemoteIdentity | None:
    """``user``'s own identity on a per-user pool while their connection works (one query), else
    None: what the launch form asks the provider with (``services.launch_options_for``)."""
    if not needs_user_credentials(pool):
        return None
    connection = RemoteConnection.objects.filter(user=user, pool=pool, state=ConnectionState.CONNECTED).first()
    return _user_identity(user, pool, connection) if connection is not None else None


def identities_for(cases) -> dict:
    """{case id: identity} for cases whose ``owner`` and ``resource_class.pool`` are loaded: one
    query for all the per-user ones, so a pass costs the same however many cases it holds."""
    pairs = {
        (case.owner_id, case.resource_class.pool_id)
        for case in cases
        if needs_user_credentials(case.resource_class.pool)
    }
    rows = RemoteConnection.objects.filter(
        user_id__in={user for user, _pool in pairs}, pool_id__in={pool for _user, pool in pairs}
    )
    found = {(row.user_id, row.pool_id): row for row in rows} if pairs else {}
    out = {}
    for case in cases:
        pool = case.resource_class.pool
        owner = case.owner if (case.owner_id, pool.pk) in pairs else None  # read only where it is named
        out[case.id] = identity_for(owner, pool, found)
    return out


def _user_identity(user, pool, connection: RemoteConnection | None) -> RemoteIdentity:
    """``user``'s identity through ``connection``: while there is none, it failed or the pool
    moved, one whose every ``token()`` raises CredentialsRequired ("reconnect at …")."""
    session = provider(pool.kind)
    if connection is None:
        label, key = f"user {user.username} (not connected)", f"user:{user.pk}:{pool.pk}:none"
        why = "does not exist: the pool runs cases under each user's own credentials"
    else:
        label = f"user {user.username} ({session.account_word} {connection.subject or 'unknown'})"
        key = f"user:{connection.pk}:{connection.generation}"
        why = _unusable(connection, pool)
    if why:
        return RemoteIdentity(RemoteIdentity.USER, label, key=key, token=partial(_refuse, _reconnect(user, pool, why)))
    refusal = _reconnect(user, pool, "was refused by the provider (401: revoked or expired)")
    refused = partial(_refused, connection.pk, connection.generation, refusal)
    if session.paste is not None:
        # What the user pasted (Qarnot's API token; Run:AI's access key, which the backend
        # trades for short-lived access tokens itself), as ``pasted_secret`` kept it.
        token = partial(_api_token, connection.sealed_secret, _reconnect(user, pool, "cannot be read"))
    else:
        token = partial(_access_token, connection.pk, connection.generation)
    return RemoteIdentity(RemoteIdentity.USER, label, key=key, token=token, refused=refused)


def _unusable(connection: RemoteConnection, pool) -> str:
    """Why ``connection`` must not be used: its pool's provider URLs changed, or it failed ("": it may)."""
    changed = moved(connection, pool)
    if changed:
        return f"was made for other provider URLs (the pool's {changed} changed since)"
    if not connection.is_connected:
        return f"failed ({connection.failure or 'the provider refused it'})"
    return ""


def _refuse(message: str, *, fresh: bool = False) -> str:
    raise CredentialsRequired(message)


def _api_token(sealed: str, unreadable: str, *, fresh: bool = False) -> str:
    """A sealed credential opened; a worker that cannot open it fails the call, transiently."""
    try:
        return sealing.unseal(sealed)
    except sealing.SealingUnavailable:
        raise BackendError(
            "stored credentials cannot be opened on this worker: GRIDGATE_CREDENTIALS_KEY is not set", transient=True
        ) from None
    except sealing.Unreadable as exc:
        raise BackendError(f"{unreadable} ({exc})", transient=True) from None


def _access_token(connection_id: int, generation: int, *, fresh: bool = False) -> str:
    """The owner's FirecREST access token: the one this process holds while it has more than
    ``oauth.MIN_TOKEN_VALIDITY`` left, else a refresh grant."""
    if not fresh:
        with _access_lock:
            cached = _access_tokens.get((connection_id, generation))
        if cached and cached[1] - time.time() > oauth.MIN_TOKEN_VALIDITY:
            return cached[0]
    return _refresh(connection_id, generation)


def _refresh(connection_id: int, generation: int) -> str:
    """The refresh grant, and the rotated refresh token stored back sealed.

    The token endpoint is called **under the connection's row lock**, the one provider call made
    with a transaction open, because a refresh token must never be used twice: two workers
    refreshing the same connection at once would both send the same token, and a provider that
    rotates them (Keycloak's "Revoke Refresh Token") refuses the second use and may end the whole
    session. The lock makes the second worker wait and then use the token the first stored. The
    call is bounded by ``oauth.TIMEOUT``."""
    failure, answer = None, None
    with transaction.atomic():
        locked = RemoteConnection.objects.select_for_update(of=("self",)).select_related("user", "pool")
        connection = locked.filter(pk=connection_id).first()
        if connection is None:
            raise CredentialsRequired(f"the connection was removed: reconnect at {connect_page()}")
        user, pool = connection.user, connection.pool
        why = _unusable(connection, pool)  # read under the lock: never a refresh token to a new host
        if why:
            raise CredentialsRequired(_reconnect(user, pool, why))
        refresh_token = _api_token(connection.sealed_secret, _reconnect(user, pool, "cannot be read"))
        try:
            answer = oauth.refresh(pool.remote_config(), refresh_token)
        except oauth.OAuthError as exc:
            if not exc.invalid_grant:
                # Unreachable or refusing for another reason (a 5xx, a misconfigured client): the
                # grant may still be good, so the call is retried later, never failed for it.
                raise BackendError(f"refreshing {user.username}'s token failed: {exc}", transient=True) from None
            failure = str(exc)
        else:
            connection.sealed_secret = sealing.seal(answer.refresh_token)  # the rotated one, sealed
            connection.last_refreshed_at = timezone.now()
            connection.save(update_fields=["sealed_secret", "last_refreshed_at", "updated_at"])
    if failure is not None:
        mark_failed(connection_id, generation, failure)
        raise CredentialsRequired(_reconnect(user, pool, f"has expired or was revoked ({failure})"))
    return _keep_access_token(connection_id, generation, answer)


def _keep_access_token(connection_id: int, generation: int, answer: oauth.TokenAnswer) -> str:
    with _access_lock:
        _access_tokens[(connection_id, generation)] = (answer.access_token, time.time() + answer.expires_in)
    return answer.access_token


def _refused(connection_id: int, generation: int, message: str) -> str:
    mark_failed(connection_id, generation, "the provider refused the credential (401)")
    return message


def mark_failed(connection_id: int, generation: int, failure: str) -> None:
    """The provider refused the credential: the user must reconnect. Compare-and-set on the
    generation: a reconnect that happened meanwhile is not marked failed."""
    now = timezone.now()
    RemoteConnection.objects.filter(pk=connection_id, generation=generation, state=ConnectionState.CONNECTED).update(
        state=ConnectionState.FAILED, failed_at=now, failure=failure[:500], updated_at=now
    )
    with _access_lock:
        _access_tokens.pop((connection_id, generation), None)
    logger.info("remote connection %s marked failed: %s", connection_id, failure)


def forget_access_tokens() -> None:
    """Drop every access token this process holds (tests; a key rotation does not need it)."""
    with _access_lock:
        _access_tokens.clear()


# -- connecting -------------------------------------------------------------------------------------
def _user_pool(user, pool_id, *, pasted: bool):
    """The pool ``pool_id`` if ``user`` may use it and it takes their own credential, pasted or
    through the provider's sign-in as ``pasted`` says; refused before anything else when nothing
    could be kept (no sealing key: :class:`~apps.credentials.sealing.SealingUnavailable`)."""
    pool = ResourcePool.objects.visible_to(user).filter(pk=pool_id).first()
    if pool is None:
        raise NotFound("No such pool.")
    if not needs_user_credentials(pool):
        raise Invalid(f"Pool '{pool.name}' runs cases under its service account: there is nothing to connect.")
    if (provider(pool.kind).paste is not None) != pasted:
        raise Invalid(f"Pool '{pool.name}' is a {pool.kind} pool: connect it from {connect_page()}.")
    sealing.require()
    return pool


def start_connect(*, user, pool_id, redirect_uri: str) -> tuple[str, dict]:
    """FirecREST: (the provider's authorization URL, the flow to keep in the user's session until
    the callback). The flow holds the PKCE verifier and the state; only the state and the
    verifier's hash (the challenge) leave this process."""
    pool = _user_pool(user, pool_id, pasted=False)  # refused before the user is sent anywhere
    verifier, challenge = oauth.pkce_pair()
    state = secrets.token_urlsafe(32)
    try:
        url = oauth.authorization_url(pool.remote_config(), state=state, challenge=challenge, redirect_uri=redirect_uri)
    except oauth.OAuthError as exc:
        raise Unavailable(str(exc)) from None
    flow = {"state": state, "verifier": verifier, "pool": pool.pk, "user": user.pk, "started": time.time()}
    return url, flow


def finish_connect(*, user, flow: dict, code: str, redirect_uri: str, max_age: float) -> RemoteConnection:
    """FirecREST: the callback half. ``flow`` is the one :func:`start_connect` made, found by the
    callback's ``state`` in this user's session (so a code from another browser or user is never
    taken). Trades the code and the PKCE verifier for tokens, checks whose they are, keeps the
    refresh token sealed."""
    if flow.get("user") != user.pk:
        raise Forbidden("This connection was started by another user.")
    if time.time() - float(flow.get("started") or 0) > max_age:
        raise Invalid(f"The connection took too long; start again from {connect_page()}.")
    pool = _user_pool(user, flow.get("pool"), pasted=False)
    try:
        answer = oauth.exchange_code(
            pool.remote_config(), code=code, verifier=flow["verifier"], redirect_uri=redirect_uri
        )
    except oauth.OAuthError as exc:
        if exc.unreachable:
            raise Unavailable(f"Connecting failed: {exc}. Try again in a moment.") from None
        raise Invalid(f"Connecting failed: {exc}. Start again from {connect_page()}.") from None
    if not answer.refresh_token:
        raise Invalid(
            "The identity provider gave no refresh token, so Gridgate could not act for you later: ask an "
            "administrator to allow the 'offline_access' scope for the pool's client."
        )
    _check_linked_identity(user, answer.issuer, answer.subject)
    connection = _store(
        user, pool, answer.refresh_token, subject=answer.subject, username=answer.username, issuer=answer.issuer
    )
    _keep_access_token(connection.pk, connection.generation, answer)
    return connection


def store_pasted(*, user, pool_id, values: dict) -> RemoteConnection:
    """A credential the user pastes (the fields their pool's provider's ``paste`` names: Qarnot's
    API token, Run:AI's access key), each of at most its ``limit`` printable ASCII characters (what
    a request header carries: a character beyond would fail only once sent, as a provider error), checked
    at the provider (its account names the identity the user's cases run under), then kept
    sealed."""
    pool = _user_pool(user, pool_id, pasted=True)
    session = provider(pool.kind)
    paste = session.paste
    names = [name for name, _what, _secret in paste.fields]
    if not set(names) <= set(values):
        fields = " and ".join(f"'{name}'" for name in names)
        raise Invalid(f"Send {fields} (your {pool.get_kind_display()} {paste.words}).")
    given = [(values.get(name) or "").strip() for name in names]
    if any(not value or len(value) > paste.limit or not all(" " < char < "\x7f" for char in value) for value in given):
        raise Invalid(paste.malformed)
    try:
        subject, username = session.account_of(pool.remote_config(), *given)
    except CredentialsRequired:
        raise Invalid(paste.refused) from None
    except BackendError as exc:
        raise Unavailable(f"{session.label} could not be asked to check the {paste.words}: {exc}") from None
    return _store(user, pool, session.pasted_secret(given), subject=subject, username=username)


def _check_linked_identity(user, issuer: str, subject: str) -> None:
    """The operators' identity links (docs/identity.md: the admin's *Identities*, issuer + subject)
    decide whose provider account a user may connect: a user linked at this issuer must connect as
    that subject, and a subject linked to another user is never taken."""
    if not issuer or not subject:
        return
    rows = list(Identity.objects.filter(issuer=issuer, user=user).values_list("subject", flat=True))
    if rows and subject not in rows:
        raise Forbidden(
            f"You are signed in at the identity provider as another account (subject {subject}) than the one "
            "linked to you here. Sign out there, then connect again as yourself, or ask an operator to check "
            "your identity link."
        )
    if Identity.objects.filter(issuer=issuer, subject=subject).exclude(user=user).exists():
        raise Forbidden(
            f"The provider account you signed in with (subject {subject}) is linked to another Gridgate user. "
            "Sign out at the identity provider and connect as yourself."
        )


def _store(user, pool, secret: str, *, subject: str, username: str, issuer: str = "") -> RemoteConnection:
    """The user's one connection to ``pool`` made or replaced: two connects at once (a double
    click, a script's retry) end in one row, the later one's, never in a unique-constraint 500
    (``get_or_create`` takes the row the other one inserted)."""
    now = timezone.now()
    values = {
        "sealed_secret": sealing.seal(secret),
        "state": ConnectionState.CONNECTED,
        "subject": subject,
        "provider_username": username,
        "issuer": issuer,
        "connected_at": now,
        "last_refreshed_at": now,
        "failed_at": None,
        "failure": "",
        "provider_urls": provider_urls(pool),
    }
    with transaction.atomic():
        connection, made = RemoteConnection.objects.select_for_update().get_or_create(
            user=user, pool=pool, defaults=values
        )
        if not made:
            for name, value in values.items():
                setattr(connection, name, value)
            connection.generation += 1  # access tokens cached for the previous grant are not used again
            connection.save()
        resume_waiting_cases(user, pool)
    logger.info("user %s connected to pool %s as %s", user.pk, pool.pk, subject or "unknown")
    return connection


def resume_waiting_cases(user, pool) -> list:
    """The owner's unfinished cases on ``pool`` are made due now and polled within the broker's
    poll interval: those that waited for this reconnect resume at once (called in the connect's
    transaction; the poll is sent once it commits)."""
    from apps.cases.models import ACTIVE, Case
    from apps.core.tasks import enqueue

    due = Case.objects.filter(owner=user, resource_class__pool=pool, status__in=list(ACTIVE)).exclude(remote_id="")
    ids = [str(pk) for pk in due.values_list("id", flat=True)]
    if ids:
        Case.objects.filter(id__in=ids).update(next_poll_at=timezone.now())
        enqueue("apps.cases.tasks.poll_cases", ids)
    return ids


@dataclass(frozen=True)
class Forgotten:
    """What disconnecting did at the provider. ``revoked``: True, the grant is revoked there;
    False, it could not be (``detail`` says why, and that the user should end it there); None,
    nothing for Gridgate to revoke (a Qarnot API token or a Run:AI access key is the user's own,
    made and deleted at the provider)."""

    revoked: bool | None
    detail: str


def disconnect(*, user, pool_id) -> Forgotten:
    """Forget ``user``'s own credential for a pool (their own alone: another user's is 404) and
    revoke a FirecREST grant at the identity provider (:func:`forget`)."""
    forgotten = forget(RemoteConnection.objects.filter(user=user, pool_id=pool_id))
    if forgotten is None:
        raise NotFound("You have no connection to this pool.")
    return forgotten


def forget(connections) -> Forgotten | None:
    """Delete the connection ``connections`` selects (staff in the admin; the user's own:
    :func:`disconnect`) and revoke its FirecREST grant; None if it is already gone.

    Claim, commit, call: the row is deleted under its lock (a refresh that holds the lock
    stores its rotated refresh token first, and that is the one revoked), the deletion commits,
    then the provider is asked to revoke the grant, with no transaction open."""
    with transaction.atomic():
        connection = connections.select_for_update(of=("self",)).select_related("pool").first()
        if connection is None:
            return None
        connection_id, pool, sealed = connection.pk, connection.pool, connection.sealed_secret
        changed = moved(connection, pool)
        connection.delete()
    with _access_lock:
        for key in [key for key in _access_tokens if key[0] == connection_id]:
            del _access_tokens[key]
    paste = provider(pool.kind).paste
    if paste is not None:
        gone = f"Gridgate no longer holds the {paste.words}"
        return Forgotten(None, f"{gone}; it stays valid at the provider until its owner deletes it there.")
    end_it = "end it at the identity provider (Keycloak: Account console → Applications)"
    if changed:
        # The grant belongs to the provider it was made with; the pool now names another, which
        # must not receive it, not even to revoke it.
        return Forgotten(False, f"Gridgate no longer holds the grant; the pool's {changed} changed since: {end_it}.")
    try:
        oauth.revoke(pool.remote_config(), sealing.unseal(sealed))
    except (sealing.SealingUnavailable, sealing.Unreadable):
        logger.warning(
            "connection %s to pool %s forgotten; its grant could not be unsealed to revoke it", connection_id, pool.pk
        )
        return Forgotten(False, f"Gridgate no longer holds the grant, but could not open it to revoke it: {end_it}.")
    except oauth.OAuthError as exc:
        logger.warning("connection %s to pool %s forgotten; revoking its grant failed: %s", connection_id, pool.pk, exc)
        return Forgotten(False, f"Gridgate no longer holds the grant, but revoking it failed ({exc}): {end_it}.")
    return Forgotten(True, "Gridgate no longer holds the grant, and the identity provider has revoked it.")


def require_connection(user, pool) -> None:
    """R-launch: on a per-user pool, a case is launched only while its owner is connected; the
    refusal (403) names the page to connect at. A grant the provider revoked without our knowing
    is found by the worker, which then fails the launch with the same advice."""
    if not needs_user_credentials(pool):
        return
    connection = RemoteConnection.objects.filter(user=user, pool=pool).only("state", "failure").first()
    refusal = connection_refusal(pool, connection)
    if refusal is not None:
        raise refusal


def connection_refusal(pool, connection) -> Forbidden | None:
    """Why a launch on per-user ``pool`` is refused with ``connection`` (the user's, or None), or
    None when it is not: the one rule behind :func:`require_connection` and the pools' per-user
    readiness (``apps.backends.readiness.user_readiness``), which reads every connection at once."""
    if not needs_user_credentials(pool) or (connection is not None and connection.is_connected):
        return None
    page = connect_page()
    if connection is None:
        kind = pool.get_kind_display()
        why = f"Pool '{pool.name}' runs cases under your own {kind} account: connect it first at {page}."
    else:
        failure = connection.failure or "the provider refused it"
        why = f"Your connection to pool '{pool.name}' failed ({failure}): reconnect at {page}, then launch again."
    return Forbidden(why, connect_url=page)


# -- what a user sees -----------------------------------------------------------------------------
def connection_rows(user) -> list[dict]:
    """Every pool ``user`` may use that runs cases under their own credentials, with their
    connection (or None): the connections page and ``GET /api/v1/connections/``."""
    pools = [
        pool for pool in ResourcePool.objects.visible_to(user).order_by("name", "id") if needs_user_credentials(pool)
    ]
    found = {row.pool_id: row for row in RemoteConnection.objects.filter(user=user, pool__in=pools)}
    return [{"pool": pool, "connection": found.get(pool.pk), "paste": provider(pool.kind).paste} for pool in pools]
