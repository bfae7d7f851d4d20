"""gridgate-client: the ``gridgate`` command line, a Python client of Gridgate's REST API, and a
Pulser ``RemoteConnection`` (``gridgate_client.pulser``, with the ``pulser`` extra)."""

from gridgate_client.api import Client, GridgateError, TimedOut
from gridgate_client.config import VERSION as __version__

__all__ = ["Client", "GridgateError", "TimedOut", "__version__"]
