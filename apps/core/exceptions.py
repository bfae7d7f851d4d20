"""The project's own service exceptions (STYLE.md, examples 1-2).

Services raise these and import nothing from DRF; they are mapped once for the API
(``apps.core.api.exceptions.exception_handler``) and once for the web pages. Each carries a
human ``detail`` and optional extra fields that reach the JSON body (e.g. ``slots_available``).
"""


class ServiceError(Exception):
    """Base class: ``status`` is the HTTP status the API answers with."""

    status = 400
    default_detail = "The request is not valid."

    def __init__(self, detail: str | None = None, **extra):
        self.detail = detail or self.default_detail
        self.extra = extra
        super().__init__(self.detail)


class Invalid(ServiceError):
    """400: the request carried a value the rule refuses."""

    status = 400
    default_detail = "The request is not valid."


class Forbidden(ServiceError):
    """403: the caller may see the object but not do this to it."""

    status = 403
    default_detail = "You do not have permission to perform this action."


class NotFound(ServiceError):
    """404: the object does not exist or is not the caller's to see."""

    status = 404
    default_detail = "Not found."


class Conflict(ServiceError):
    """409: the request conflicts with the current state (extra fields say which)."""

    status = 409
    default_detail = "The request conflicts with the current state."


class Unavailable(ServiceError):
    """503: a transient condition (a provider, a lock, the database); retrying later may work."""

    status = 503
    default_detail = "The service is temporarily unavailable; try again shortly."
