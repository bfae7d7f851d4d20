"""The log's format (config/settings.py ``LOGGING``): one record, one line.

Records quote what others chose: a request's path (``Internal Server Error: /api/v1/…``), a
provider's or an emulation's error, a name. A line break in such text would start a line that
reads as a record of its own ("… CRITICAL … every session revoked") to whoever reads or greps the
log, so the message is written with its line breaks and other control characters as escapes
(``\\n``, ``\\r``, ``\\x85``, ``\\u2028``: :func:`apps.core.text.printable`). A record's traceback keeps
its lines, after the record's: it is Python's to read, and an exception's own message in it is
written as raised.
"""

import logging

from apps.core.text import printable


class OneLineFormatter(logging.Formatter):
    """``logging.Formatter`` whose record line (time, level, logger, message) is one line."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))
