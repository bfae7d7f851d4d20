"""The Qarnot backend (``backend.py``: the five verbs, buckets and task states; ``client.py``:
the qarnot SDK's connection and what its errors mean; ``doctor.py``: its own checks)."""

from apps.backends.qarnot.backend import QarnotBackend, bucket_names, map_state

__all__ = ["QarnotBackend", "bucket_names", "map_state"]
