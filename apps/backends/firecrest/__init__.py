"""The FirecREST backend (``backend.py``: the five verbs and Slurm's states; ``client.py``: the
pyfirecrest calls and what their errors mean; ``doctor.py``: its own checks)."""

from apps.backends.firecrest.backend import FirecrestBackend, map_state
from apps.backends.firecrest.client import Session
from apps.backends.remote.session import _clients

__all__ = ["FirecrestBackend", "Session", "_clients", "map_state"]
