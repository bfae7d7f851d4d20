"""Service credentials: environment variables whose names carry one prefix (R-BACK-1).

A pool's ``remote`` and a device's ``config`` name the variables that hold their credentials
(``token_env``, ``client_secret_env``, ``auth_env`` …), and the service sends each value to a URL
the same configuration chooses. Any name at all would let whoever edits a pool send the web
process's ``SECRET_KEY`` or ``DATABASE_URL`` to a listener of theirs (and a forged, signed
django-q2 task with it). So only variables named ``GRIDGATE_CRED_…`` can be credentials: checked
when the configuration is written (:func:`name_problem`) and again when a value is read
(:func:`read`), so a row written before the rule sends nothing either. The service's own
settings (``SECRET_KEY``, ``DATABASE_URL``, ``GRIDGATE_REDIS_URL`` …) never carry the prefix.

A prefix alone let any pool name another pool's variable: whoever may change one pool could point
it at the service account of another and then at a host of theirs. So a pool's credential is read
only when the variable is **bound** to that pool by the environment itself, which pool editors do
not control: ``<NAME>_POOLS`` lists the ids of the pools allowed to use ``<NAME>``
(``GRIDGATE_CRED_QARNOT_TOKEN_POOLS=3,7``; ``*`` for any pool, a deliberate choice for a
single-tenant site).
"""

from __future__ import annotations

import os
import re

PREFIX = "GRIDGATE_CRED_"
#: the companion variable listing the pools a credential variable is bound to
POOLS_SUFFIX = "_POOLS"
#: the key by which a pool's ``remote_config()`` says which pool it is (never a stored key)
POOL_KEY = "_pool"
#: False only in tests that do not exercise the binding (every credential then reads as bound)
BINDING_REQUIRED = True
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


def bound_pools(name: str) -> set[str]:
    """The pool ids ``<name>_POOLS`` binds the variable to (``*``: any)."""
    raw = os.environ.get(f"{name}{POOLS_SUFFIX}", "")
    return {part.strip() for part in raw.replace(" ", ",").split(",") if part.strip()}


def binding_problem(name: str, pool) -> str | None:
    """Why the variable ``name`` may not be read for ``pool`` (an id), or None."""
    if not BINDING_REQUIRED:
        return None
    allowed = bound_pools(name)
    if "*" in allowed or (pool is not None and str(pool) in allowed):
        return None
    which = f"pool {pool}" if pool is not None else "this use (no pool)"
    return (
        f"is not bound to {which}: set {name}{POOLS_SUFFIX} to the ids of the pools that may use it "
        f"(e.g. {name}{POOLS_SUFFIX}={pool if pool is not None else 'ID'}) on the web and worker hosts "
        "(docs/operations.md, 'Secrets')"
    )


#: ``read``'s ``pool`` when no pool is concerned (a configuration checked before any pool has it)
NOT_A_POOL = object()


def pool_of(config: dict | None):
    """The pool a ``remote_config()`` or a device's ``credential_config()`` belongs to."""
    return (config or {}).get(POOL_KEY, NOT_A_POOL)


def read(name, what: str, *, pool=NOT_A_POOL) -> str:
    """The value of the credential variable ``name`` (``what`` says whose, for the message) for
    the pool ``pool`` (its id; None: a pool whose id is unknown, refused), to which it must be
    bound."""
    problem = name_problem(name)
    if problem:
        raise CredentialError(f"the {what} variable {name!r} {problem}")
    problem = None if pool is NOT_A_POOL else binding_problem(name, pool)
    if problem:
        raise CredentialError(f"the {what} variable {name} {problem}")
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
