"""MUNGE authentication for the QRMI endpoint and the main API (R-QRMI-2).

A request carries ``X-Munge-Cred``; the credential is decoded once per request with the local
munged and the outcome is kept on the Django request, because munged refuses a second decode of
the same credential as a replay (so a second authenticator, a re-wrapped DRF request or a view
asking again must never decode it twice).
"""

from django.contrib.auth.models import AnonymousUser
from django.utils.functional import SimpleLazyObject
from rest_framework import status
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed

from apps.qrmi.munge import CredentialRejected, MungeIdentity, MungeUnavailable, decode
from apps.qrmi.selectors import user_for_uid

HEADER = "X-Munge-Cred"
_OUTCOME = "_gridgate_munge_outcome"


class MungeServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "MUNGE credentials cannot be verified right now (munged unreachable)."
    default_code = "munge_unavailable"


def verified_identity(request) -> MungeIdentity | None:
    """The verified identity of ``request``'s credential, None without one (R-QRMI-2).

    The first call decodes; every later call on the same request returns the stored outcome
    (identity or the same error) without asking munged again.
    """
    http = getattr(request, "_request", request)  # a DRF Request wraps the Django one
    if not hasattr(http, _OUTCOME):
        credential = http.headers.get(HEADER)
        if credential is None:
            outcome = None
        else:
            try:
                outcome = decode(credential)
            except (CredentialRejected, MungeUnavailable) as exc:
                outcome = exc
        setattr(http, _OUTCOME, outcome)
    outcome = getattr(http, _OUTCOME)
    if isinstance(outcome, CredentialRejected):
        raise AuthenticationFailed(f"MUNGE credential rejected: {outcome.reason}.")
    if isinstance(outcome, MungeUnavailable):
        raise MungeServiceUnavailable()
    return outcome


class MungeAuthentication(BaseAuthentication):
    """``X-Munge-Cred`` as an alternative to a token on the main API: the credential's uid must
    be linked to an active user (the user's ``unix_uid``), who is then the caller."""

    require_account = True

    def authenticate(self, request):
        identity = verified_identity(request)
        if identity is None:
            return None
        if not self.require_account:
            # Looked up only if a view asks (a service uid acquiring or releasing never does):
            # one statement saved on the hot QRMI routes.
            return SimpleLazyObject(lambda: user_for_uid(identity.uid) or AnonymousUser()), identity
        user = user_for_uid(identity.uid)
        if user is None:
            raise AuthenticationFailed(
                f"Unix uid {identity.uid} is not linked to a Gridgate account "
                "(an administrator sets the user's Unix uid in the admin)."
            )
        return user, identity

    def authenticate_header(self, request):
        # A WWW-Authenticate value makes DRF answer 401 (not 403) to unauthenticated requests.
        return 'Munge realm="gridgate"'


class QrmiMungeAuthentication(MungeAuthentication):
    """The QRMI endpoint's only authentication: a verified uid without a linked account is still
    authenticated (``request.user`` anonymous, ``request.auth`` the identity), because the
    service uid (root, for the SPANK plugin) usually has no Gridgate account; the views decide
    what such a caller may do."""

    require_account = False
