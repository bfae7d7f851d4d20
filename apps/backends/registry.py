"""Which backend serves which pool kind.

``GRIDGATE_CASE_BACKENDS`` (setting, from the environment as ``kind=name,kind=name``) maps a pool
kind to a backend name; the default maps every pool kind (``local``, ``slurm``, ``firecrest``,
``qarnot``, ``runai``) to the backend of the same name (``BACKENDS`` below). A kind the mapping
leaves out has no case backend: launching there is refused, naming the kinds that run cases.
"""

from __future__ import annotations

from importlib import import_module

from django.conf import settings

from apps.backends.base import BackendError, ExecutionBackend
from apps.resources.remote import POOL_REMOTE_KEYS

#: backend name → "module:Class" (imported lazily so an optional SDK is imported only when used)
BACKENDS: dict[str, str] = {
    "fake": "apps.backends.fake:FakeBackend",
    "firecrest": "apps.backends.firecrest.backend:FirecrestBackend",
    "local": "apps.backends.local:LocalBackend",
    "qarnot": "apps.backends.qarnot.backend:QarnotBackend",
    "runai": "apps.backends.runai.backend:RunaiBackend",
    "slurm": "apps.backends.slurm:SlurmBackend",
}

#: without ``GRIDGATE_CASE_BACKENDS``: every pool kind to the backend of its name
DEFAULT_KIND_MAP = {kind: kind for kind in POOL_REMOTE_KEYS}


class NoBackend(BackendError):
    """The pool's kind has no case backend (``GRIDGATE_CASE_BACKENDS`` leaves it out)."""


def kind_map() -> dict[str, str]:
    configured = getattr(settings, "GRIDGATE_CASE_BACKENDS", None)
    return dict(DEFAULT_KIND_MAP if configured is None else configured)


def backend_class(name: str) -> type[ExecutionBackend]:
    try:
        target = BACKENDS[name]
    except KeyError:
        raise NoBackend(f"unknown execution backend {name!r}; registered: {', '.join(sorted(BACKENDS))}") from None
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)


def get_backend(name: str) -> ExecutionBackend:
    return backend_class(name)()


def backend_name_for_kind(kind: str) -> str:
    name = kind_map().get(kind)
    if not name:
        served = ", ".join(sorted(kind_map())) or "none"
        raise NoBackend(
            f"pools of kind '{kind}' have no case backend: cases run on pools of kind {served}. "
            "Choose a class of such a pool."
        )
    return name


def describe() -> list[dict]:
    """``GET /backends/``: each registered backend with the pool kinds it serves here."""
    mapping = kind_map()
    return [
        {"name": name, "kinds": sorted(kind for kind, served_by in mapping.items() if served_by == name)}
        for name in sorted(BACKENDS)
    ]
