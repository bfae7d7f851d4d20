"""OpenAPI description of the schedule feed's token (R-RES-4)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class FeedTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "apps.reservations.api.views.FeedTokenAuthentication"
    name = "feedToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "query",
            "name": "token",
            "description": "Your personal feed token (from a schedule's `ics_url`); reads schedules, nothing else.",
        }
