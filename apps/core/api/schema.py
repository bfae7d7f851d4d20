"""The OpenAPI schema's shared error responses (SPEC §7, §10).

Every operation documents the error codes the API can answer with, all in the one JSON error
shape: ``{"detail": "…"}`` plus optional fields (``slots_available``, ``status``, ``limit_bytes``),
or, for a validation 400, ``{"<field>": ["…"]}``. Added here once rather than on each view, so a
new endpoint cannot forget them; an operation's own description of a code wins.
"""

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    """The API's error body: ``detail`` and extra fields, or validation messages keyed by field."""

    detail = serializers.CharField(required=False, help_text="What went wrong, in words.")


READ_ERRORS = {
    "400": "A query parameter is not valid.",
    "401": "No or bad credentials.",
    "403": "Not allowed for this user.",
    "404": "No such object, or not yours to see.",
    "503": "A transient failure (database lock race, provider down): retry after `Retry-After` seconds.",
}
WRITE_ERRORS = {
    **READ_ERRORS,
    "400": "The request is not valid: `{field: [messages]}` or `{detail}` (e.g. JSON nested too deeply).",
    "409": "Conflicts with the current state; extra fields say which (e.g. `slots_available`, `status`).",
    "413": "The body is larger than the limit given in `limit_bytes` (or the upload limit).",
    "415": "Unsupported media type.",
}


class GridgateAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        errors = READ_ERRORS if self.method in ("GET", "HEAD", "OPTIONS") else WRITE_ERRORS
        error_body = self._get_response_for_code(ErrorSerializer, "400", direction=direction)["content"]
        for code, description in errors.items():
            responses.setdefault(code, {"description": description})
        for code, response in responses.items():
            if int(code) >= 400 and not response.get("content"):
                response["content"] = error_body
        return responses
