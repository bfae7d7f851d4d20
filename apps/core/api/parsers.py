"""The API's parsers: JSON with a nesting limit, multipart refusing path-like file names."""

import html

from django.http.multipartparser import MultiPartParser as DjangoMultiPartParser
from django.http.multipartparser import MultiPartParserError
from rest_framework.exceptions import ParseError
from rest_framework.parsers import DataAndFiles, JSONParser, MultiPartParser, get_encoding

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


class _NamedFilesParser(DjangoMultiPartParser):
    """Django's multipart parser cuts a file name to its last path component, silently: an upload
    named ``../x`` or ``dir/x`` landed as ``x``. Such names are refused instead."""

    def sanitize_file_name(self, file_name):
        raw = html.unescape(file_name)
        if "/" in raw or "\\" in raw or raw.strip() in {".", ".."}:
            raise MultiPartParserError(
                f"file name {raw!r} is not a plain file name: send base names, without '/', '\\' or '..'."
            )
        return super().sanitize_file_name(file_name)


class NamedFilesMultiPartParser(MultiPartParser):
    """DRF's multipart parser, refusing file names with a directory part (400 naming the file)."""

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        request = parser_context["request"]
        meta = request.META.copy()
        meta["CONTENT_TYPE"] = media_type
        try:
            parser = _NamedFilesParser(meta, stream, request.upload_handlers, get_encoding(parser_context))
            data, files = parser.parse()
        except MultiPartParserError as exc:
            raise ParseError(f"Multipart form parse error - {exc}") from None
        return DataAndFiles(data, files)
