"""Launch options of a class (R-BACK-2) and the check of a user's choices against them (R-BACK-6)."""

import logging

from django.conf import settings
from django.core.cache import cache

from apps.backends import registry
from apps.backends.base import LaunchOptions, validate_launch_options
from apps.backends.remote_common import scrub_for_pool
from apps.credentials import services as credential_services

logger = logging.getLogger(__name__)


def _pool_options(name: str, pool, user) -> LaunchOptions:
    """The backend's answer for ``pool`` (R-BACK-2): healthy answers are cached 10 min, so the
    provider is asked when a form opens or a launch is checked, not on every page load. A
    degraded answer (provider unreachable) is never cached: the next request asks again instead
    of holding the user to the defaults for ten minutes. On a per-user pool the backend asks with
    ``user``'s own connected credential, and the answer is that credential's alone: cached under
    it, never shown to another user."""
    identity = credential_services.connected_identity(user, pool) if user is not None else None
    whose = f":{identity.key}" if identity is not None else ""
    key = f"gridgate:launch-options:v3:{name}:{pool.pk}:{pool.updated_at.timestamp() if pool.updated_at else 0}{whose}"
    cached = cache.get(key)
    if cached is not None:
        return LaunchOptions.from_dict(cached)
    try:
        answer = registry.get_backend(name).launch_options(pool, identity)
    except Exception as exc:  # whatever the provider raised, the form still opens with defaults
        text = scrub_for_pool(pool, exc)  # R-BACK-1: an SDK may echo a credential back
        logger.warning("launch options of the %s backend: %s", name, text)
        answer = LaunchOptions(degraded=True, message=f"the {name} backend could not be asked: {text}")
    answer.message = scrub_for_pool(pool, answer.message)
    if not answer.degraded:
        cache.set(key, answer.as_dict(), settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS)
    return answer


def declared_options(resource_class, user) -> tuple[str | None, LaunchOptions]:
    """(backend name, what ``user`` may choose on ``resource_class``): the pool's options with the
    class's overrides pinned (R-BACK-6: a class partition wins over any provider default). The
    name is None when the pool's kind has no case backend (the message says why)."""
    pool = resource_class.pool
    try:
        name = registry.backend_name_for_kind(pool.kind)
    except registry.NoBackend as exc:
        return None, LaunchOptions(message=str(exc))
    answer = _pool_options(name, pool, user)
    return name, registry.get_backend(name).pin_class_overrides(answer, resource_class)


def launch_options_for(resource_class, user) -> dict:
    """``GET /resource-classes/{id}/launch-options/`` and the web launch dialog (R-BACK-2): what
    ``user`` (whose cases would run on it) may choose."""
    name, answer = declared_options(resource_class, user)
    return {"backend": name, **answer.as_dict()}


def check_launch_options(resource_class, chosen, user) -> dict:
    """R-BACK-6: ``chosen`` against what the class's backend declares to ``user``, the case's
    owner; returns the clean options or raises ``Invalid`` (400) naming the allowed values. A
    kind without a case backend declares nothing, so it accepts no option (launching such a case
    says why it cannot run)."""
    if chosen == {}:
        return {}  # nothing to check: the provider is not asked for nothing
    _name, declared = declared_options(resource_class, user)
    return validate_launch_options(declared, chosen)
