"""OpenAPI description of MUNGE authentication on the main API (R-QRMI-2)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class MungeAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "apps.qrmi.authentication.MungeAuthentication"
    match_subclasses = True
    name = "munge"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "X-Munge-Cred",
            "description": "A fresh MUNGE credential (`munge -n`) from a uid linked to your user; used once.",
        }
