"""The API's JSON parser: DRF's, with the nesting limit of ``apps.core.jsonlimits`` (issue 16, item 1)."""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from apps.core.jsonlimits import MAX_JSON_DEPTH, check_depth


class DepthLimitedJSONParser(JSONParser):
    """A body nested deeper than ``MAX_JSON_DEPTH`` is a 400 ``{"detail"}``, never a RecursionError 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels.") from None
        try:
            return check_depth(data)
        except ValueError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels.") from None
