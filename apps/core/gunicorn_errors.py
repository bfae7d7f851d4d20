"""gunicorn's own error answers as the project's JSON (``{"detail": …}``), for config/gunicorn.conf.py.

gunicorn refuses some requests before the application sees them: a request line (path and query
string) over ``limit_request_line`` (414), a header over ``limit_request_field_size`` or more than
``limit_request_fields`` of them (431), a malformed request (400). It writes those answers with
``gunicorn.util.write_error``, an HTML page; every other error of the API is JSON (SPEC §10). This
module's :func:`write_error` replaces it (gunicorn calls the module attribute at each error):
the same status, ``Connection: close``, and a JSON body naming the limit and the variable that
sets it. Standard library only: the configuration file imports it before Django is set up.
"""

import json
import os

from gunicorn import util

LIMITS = {
    414: (
        "The request line (method, path and query string) is longer than this server accepts: at most {line} "
        "bytes (GRIDGATE_WEB_LIMIT_REQUEST_LINE). Send long filters in a request body instead."
    ),
    431: (
        "The request's headers are larger than this server accepts: at most {fields} headers of at most {size} "
        "bytes each (GRIDGATE_WEB_LIMIT_REQUEST_FIELDS, GRIDGATE_WEB_LIMIT_REQUEST_FIELD_SIZE)."
    ),
}


def limit(name: str, default: int, *, low: int, high: int) -> int:
    """A gunicorn limit from the environment; a value out of range stops the server naming it."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a whole number.") from None
    if not low <= value <= high:
        raise SystemExit(f"{name}={raw!r} must be from {low} to {high}.")
    return value


def detail(status: int, reason: str, message: str, limits: dict) -> str:
    if status in LIMITS:
        return LIMITS[status].format(**limits)
    if status >= 500:
        return "Internal server error."
    return f"{reason}: {message}" if message else reason


def json_error_writer(limits: dict):
    """A ``write_error(sock, status_int, reason, mesg)`` like gunicorn's, writing JSON."""

    def write_error(sock, status_int, reason, mesg):
        body = json.dumps({"detail": detail(status_int, reason, mesg, limits)}).encode()  # ASCII: escaped
        head = (
            f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        util.write_nonblock(sock, head.encode("latin-1") + body)

    return write_error


def install(*, line: int, fields: int, size: int) -> None:
    util.write_error = json_error_writer({"line": line, "fields": fields, "size": size})
