"""The API's JSON renderer: every answer encodes, whatever text a client sent.

JSON itself may carry any string, a lone UTF-16 surrogate included (``"\\ud800"``, which Python's
``json`` parser accepts), but DRF writes non-ASCII characters raw and then encodes the text as
UTF-8, which a lone surrogate cannot be: a 400 whose message echoed a client's ``"\\ud800"`` (a
case's campaign, a pool's kind, a launch option's key) became a 500. Such an answer is written
again with every non-ASCII character escaped (``\\ud800``), which is the same JSON; every other
answer keeps its characters as they are.
"""

from rest_framework import renderers


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            self.ensure_ascii = True  # this instance serves one response (DRF makes one per request)
            return super().render(data, accepted_media_type, renderer_context)


class BrowsableAPIRenderer(renderers.BrowsableAPIRenderer):
    """The browsable API's page shows the request's body again in its form: a lone surrogate there
    is written as ``\\ud800`` (the page is text for a person to read) instead of failing the page."""

    def render(self, data, accepted_media_type=None, renderer_context=None):
        page = super().render(data, accepted_media_type, renderer_context)
        return page.encode(self.charset, "backslashreplace") if isinstance(page, str) else page
