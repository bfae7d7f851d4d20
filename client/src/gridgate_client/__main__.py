"""``python -m gridgate_client``: the ``gridgate`` command."""

from gridgate_client.cli import entry

entry()
