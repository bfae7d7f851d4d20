"""The Run:AI backend (``backend.py``: the five verbs, the shared volume and workload phases;
``client.py``: runapy's client and what its errors mean; ``doctor.py``: its own checks)."""

from apps.backends.remote.session import _clients
from apps.backends.runai.backend import RunaiBackend, map_phase
from apps.backends.runai.client import TokenRefused, build_client

__all__ = ["RunaiBackend", "TokenRefused", "_clients", "build_client", "map_phase"]
