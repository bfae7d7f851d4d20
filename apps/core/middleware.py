"""Never HTML on ``/api/`` or ``/qrmi/``.

DRF's exception handler covers errors raised inside an API view. This middleware covers the rest:
Django's request-body guards raised while a view parses (``RequestDataTooBig``, ``TooManyFieldsSent``,
``TooManyFilesSent``), an uncaught exception (500), and error pages Django renders itself (an
unknown URL's 404, a CSRF 403). Each becomes ``{"detail": …}`` JSON; pages outside those prefixes
are left alone.
"""

import logging

from django.http import JsonResponse

from apps.core.api.exceptions import request_error

log = logging.getLogger("django.request")

API_PREFIXES = ("/api/", "/qrmi/")
JSON_TYPES = ("application/json", "application/problem+json")
KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")


def is_api(request) -> bool:
    return request.path_info.startswith(API_PREFIXES)


class ApiErrorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code < 400 or response.streaming or not is_api(request):
            return response
        if response.get("Content-Type", "").split(";")[0].strip() in JSON_TYPES:
            return response
        text = response.content.decode("utf-8", "replace").strip() if response.content else ""
        plain = response.get("Content-Type", "").startswith("text/plain") and 0 < len(text) <= 500
        converted = JsonResponse({"detail": text if plain else response.reason_phrase}, status=response.status_code)
        for header in KEPT_HEADERS:
            if header in response:
                converted[header] = response[header]
        return converted

    def process_exception(self, request, exception):
        if not is_api(request):
            return None
        mapped = request_error(exception)
        logged = mapped is None
        if logged:
            # An uncaught server error: logged with its traceback here (Django would have), and
            # answered as JSON without internals.
            log.error("Internal Server Error: %s", request.path, exc_info=exception)
            mapped = {"detail": "Internal server error."}, 500, {}
        body, status, headers = mapped
        response = JsonResponse(body, status=status, json_dumps_params={"ensure_ascii": False})
        if logged:
            # Django's handler logs every 5xx answer it has not been told about: a second record,
            # without the traceback (django.utils.log.log_response reads this flag).
            response._has_been_logged = True
        for name, value in headers.items():
            response[name] = value
        return response
