"""The log's format (config/settings.py ``LOGGING``): one record, one line.

Records quote what others chose: a request's path (``Internal Server Error: /api/v1/…``), a
provider's or an emulation's error, a name. A line break in such text would start a line that
reads as a record of its own ("… CRITICAL … every session revoked") to whoever reads or greps the
log, so the message is written with its line breaks and other control characters as escapes
(``\\n``, ``\\r``, ``\\x85``, ``\\u2028``: :func:`apps.core.text.printable`). A record's traceback keeps
its lines (frames, chaining), but each exception's own message in it (``ValueError: …``, and its
notes), which may quote the same values, is written the same way, on one line; in an exception
group's too, behind its margin (``  | ``).
"""

import logging
import re
import traceback

from apps.core.text import printable

#: the margin an exception group's traceback writes before each line of its members
_MARGIN = re.compile(r" *\| ")


class OneLineFormatter(logging.Formatter):
    """``logging.Formatter`` whose record line (time, level, logger, message) is one line."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        _, value, tb = ei
        if value is None:
            return super().formatException(ei)
        report = traceback.TracebackException(type(value), value, tb)
        # Each exception of the chain (causes and contexts) and of a group says its message in its
        # own chunk (a group member's behind the group's margin on each of its lines).
        messages, pending, seen = set(), [report], set()
        while pending:
            exc = pending.pop()
            if id(exc) not in seen:
                seen.add(id(exc))
                messages.update(exc.format_exception_only())
                pending += [e for e in (exc.__cause__, exc.__context__) if e is not None]
                pending += getattr(exc, "exceptions", None) or []
        # A message's lines and its notes' lines (each its own chunk) are joined into one line.
        lines, joined = [], False
        for chunk in report.format():
            margin = _MARGIN.match(chunk) if chunk not in messages else None
            margin = margin.group() if margin else ""
            bare = chunk.replace("\n" + margin, "\n")[len(margin) :]
            if bare not in messages:
                lines.append(chunk)
                joined = False
            elif joined:  # the same exception's next note line
                lines[-1] = lines[-1][:-1] + "\\n" + printable(bare[:-1]) + "\n"
            else:
                lines.append(margin + printable(bare[:-1]) + "\n")
                joined = True
        return "".join(lines).removesuffix("\n")
