"""OpenAPI description of the identity provider's bearer tokens on the API (docs/identity.md)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "apps.accounts.oidc.BearerAuthentication"
    name = "oidcBearer"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "An access token (RFC 9068, typ at+jwt) from the centre's identity provider, for the "
            "API's audience, of a user who signed in once or an identity an operator linked.",
        }


class FreshSessionAuthenticationScheme(OpenApiAuthenticationExtension):
    """DRF's session scheme, for the session authentication that refuses a stale provider sign-in."""

    target_class = "apps.accounts.authentication.FreshSessionAuthentication"
    name = "cookieAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
