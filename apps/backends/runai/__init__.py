"""The Run:AI backend (``backend.py``: the five verbs, the shared volume and workload phases;
``client.py``: runapy's client and what its errors mean; ``doctor.py``: its own checks)."""

from apps.backends.remote.session import _clients
from apps.backends.runai.backend import RunaiBackend, map_phase
from apps.backends.runai.client import RunaiError, Session, TokenRefused, account_of, build_client, token_claims

__all__ = [
    "RunaiBackend",
    "RunaiError",
    "Session",
    "TokenRefused",
    "_clients",
    "account_of",
    "build_client",
    "map_phase",
    "token_claims",
]
