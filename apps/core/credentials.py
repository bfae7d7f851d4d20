"""Service credentials: environment variables whose names carry one prefix (R-BACK-1).

A pool's ``remote`` and a device's ``config`` name the variables that hold their credentials
(``token_env``, ``client_secret_env``, ``auth_env`` …), and the service sends each value to a URL
the same configuration chooses. Any name at all would let whoever edits a pool send the web
process's ``SECRET_KEY`` or ``DATABASE_URL`` to a listener of theirs (and a forged, signed
django-q2 task with it). So only variables named ``GRIDGATE_CRED_…`` can be credentials: checked
when the configuration is written (:func:`name_problem`) and again when a value is read
(:func:`read`), so a row written before the rule sends nothing either. The service's own
settings (``SECRET_KEY``, ``DATABASE_URL``, ``GRIDGATE_REDIS_URL`` …) never carry the prefix.
"""

from __future__ import annotations

import os
import re

PREFIX = "GRIDGATE_CRED_"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CredentialError(Exception):
    """A credential variable that is not allowed or not set. The message names the variable,
    never a value."""


def name_problem(name) -> str | None:
    """Why ``name`` cannot name a credential variable, or None."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return "must be an environment variable name (letters, digits, underscores)"
    if not name.startswith(PREFIX) or name == PREFIX:
        return (
            f"must name a variable whose name starts with {PREFIX} (e.g. {PREFIX}{name.upper()[:40]}): "
            "only those may hold credentials, so no configuration can send the service's own settings anywhere"
        )
    return None


def read(name, what: str) -> str:
    """The value of the credential variable ``name`` (``what`` says whose, for the message)."""
    problem = name_problem(name)
    if problem:
        raise CredentialError(f"the {what} variable {name!r} {problem}")
    value = os.environ.get(name, "")
    if not value:
        raise CredentialError(
            f"the {what} is missing: set the environment variable {name} on the worker hosts "
            "(its name comes from the pool's or device's configuration)"
        )
    return value


def values_named_in(config: dict | None) -> list[str]:
    """The values of the credentials ``config`` names (its ``*_env`` keys), for scrubbing them
    out of any text a user may see."""
    names = [value for key, value in (config or {}).items() if key.endswith("_env") and isinstance(value, str)]
    return [os.environ[name] for name in names if name_problem(name) is None and os.environ.get(name)]
