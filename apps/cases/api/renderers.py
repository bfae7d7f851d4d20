import json

from rest_framework.renderers import BaseRenderer


class PlainTextRenderer(BaseRenderer):
    """``text/plain`` for logs; an error body (a dict) is rendered as its ``detail`` text."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, dict):
            data = data.get("detail") or json.dumps(data)
        return str(data if data is not None else "").encode(self.charset)


class AnyMediaRenderer(BaseRenderer):
    """Lets a download answer any ``Accept`` header; errors still come out as JSON text."""

    media_type = "*/*"
    format = "bin"
    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data).encode() if data is not None else b""
