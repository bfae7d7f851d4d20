"""The Qarnot backend (``backend.py``: the five verbs, buckets and task states; ``client.py``:
the qarnot SDK's connection and what its errors mean; ``doctor.py``: its own checks)."""

from apps.backends.qarnot.backend import STATE_DIR, QarnotBackend, bucket_names, map_state
from apps.backends.qarnot.client import Session, account_of
from apps.backends.remote.session import _clients as _connections

__all__ = ["STATE_DIR", "QarnotBackend", "Session", "_connections", "account_of", "bucket_names", "map_state"]
