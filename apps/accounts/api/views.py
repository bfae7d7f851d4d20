from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from apps.accounts import services
from apps.accounts.api.serializers import TokenRequestSerializer, TokenResponseSerializer
from apps.core.api.schema import ErrorSerializer


class TokenView(APIView):
    """``POST {"username", "password"}`` → ``{"token", "expires_at"}``; send the token as
    ``Authorization: Token <key>``.

    Each successful call issues a new token: only its digest is stored, so an earlier one cannot be
    given back. Earlier tokens stay valid until they expire or the password changes.
    """

    # No authentication: a client re-logging in with its expired token still in its headers must
    # get a new token, not a 401.
    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = []  # django-axes counts failed logins (apps.accounts.lockout)
    renderer_classes = [JSONRenderer]
    # The depth-limited JSON parser: this public endpoint needs it most.
    parser_classes = api_settings.DEFAULT_PARSER_CLASSES

    @extend_schema(
        request=TokenRequestSerializer,
        responses={
            200: TokenResponseSerializer,
            400: OpenApiResponse(
                ErrorSerializer, description="Wrong username or password, or a field missing: `{field: [messages]}`."
            ),
            429: OpenApiResponse(
                ErrorSerializer,
                description="Too many failed logins for this username from this address: retry after "
                "`Retry-After` seconds (even with the right password), or ask an administrator to unlock.",
            ),
        },
        auth=[],
    )
    def post(self, request):
        serializer = TokenRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        user = services.log_in(request=request, username=data["username"], password=data["password"])
        token, key = services.issue_token(user, name=data.get("name", ""))
        return Response(TokenResponseSerializer({"token": key, "expires_at": token.expires_at}).data)
