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
            "description": "A JWT from the centre's identity provider, for a user who signed in once.",
        }
