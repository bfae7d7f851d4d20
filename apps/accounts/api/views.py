from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from apps.accounts import selectors, services
from apps.accounts.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    TokenRequestSerializer,
    TokenResponseSerializer,
)
from apps.accounts.models import ApiToken
from apps.core.api.renderers import JSONRenderer
from apps.core.api.schema import ErrorSerializer


class TokenView(APIView):
    """``POST {"username", "password"}`` (optionally ``"name"``, ``"expires_in_days"``) →
    ``{"id", "token", "expires_at"}``; send the token as ``Authorization: Token <key>``.

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
                ErrorSerializer,
                description="Wrong username or password, a field missing, or `expires_in_days` out of range: "
                "`{field: [messages]}`.",
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
        token, key = services.issue_token(user, name=data.get("name", ""), days=data.get("expires_in_days"))
        return Response(TokenResponseSerializer({"id": token.pk, "token": key, "expires_at": token.expires_at}).data)


@extend_schema_view(
    list=extend_schema(summary="Your API tokens", responses=ApiTokenSerializer),
    create=extend_schema(
        summary="Issue a personal API token",
        request=ApiTokenCreateSerializer,
        responses={
            201: ApiTokenCreatedSerializer,
            400: OpenApiResponse(
                ErrorSerializer, description="`name` missing or too long, `expires_in_days` out of range."
            ),
        },
    ),
    destroy=extend_schema(
        summary="Revoke one of your API tokens",
        parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH, description="The token's `id` in the list.")],
        responses={204: None, 404: OpenApiResponse(ErrorSerializer, description="No token of yours with this id.")},
    ),
)
class ApiTokenViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The caller's own API tokens (staff too: operators see everyone's in the admin). The key is in
    the creation's answer only; the list never holds it nor its digest. Revoking deletes the token:
    its key answers 401 from its next request."""

    serializer_class = ApiTokenSerializer
    lookup_value_regex = "[0-9]+"  # a non-numeric id is an unknown URL (404), not a lookup error

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return ApiToken.objects.none()
        return selectors.tokens_of(self.request.user)

    def create(self, request):
        body = ApiTokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        token, key = services.issue_token(request.user, name=data["name"], days=data.get("expires_in_days"))
        return Response(ApiTokenCreatedSerializer(token, context={"key": key}).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.revoke_token(request.user, int(pk))  # someone else's: NotFound, 404 like an unknown id
        return Response(status=status.HTTP_204_NO_CONTENT)
