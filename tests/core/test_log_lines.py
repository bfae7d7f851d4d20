"""One log record, one line: text someone else chose (a request's path, an error quoting a user's
input) cannot start a line of its own in the operators' log and pass for another record."""

import io
import logging
import re

import pytest

from apps.scheduling.api.views import JobViewSet

pytestmark = pytest.mark.django_db

FORGED = "2026-12-06 14:00:00,000 CRITICAL apps_sessions every session revoked by staff"  # no dot: a URL id
#: how every record of the configured format begins (LOGGING's "plain" formatter)
RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+ ")


@pytest.fixture
def console():
    """What the configured console handler writes: the operators' log."""
    (handler,) = [h for h in logging.getLogger().handlers if h.get_name() == "console"]
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    yield buffer
    handler.setStream(previous)


def records(text: str) -> list[str]:
    """The log's lines as a reader splits them (a CR, an LS or a NEL ends a line for some)."""
    return [line for line in re.split(r"\r\n|[\r\n\x85\u2028\u2029]", text) if line]


@pytest.mark.parametrize(
    "quoted, shown",
    [("%0A", "\\n"), ("%0D", "\\r"), ("%0D%0A", "\\r\\n"), ("%C2%85", "\\x85"), ("%E2%80%A8", "\\u2028")],
)
def test_a_request_path_cannot_forge_a_log_line(console, monkeypatch, staff, api, quoted, shown):
    """An API server error is logged with the request's path (apps/core/middleware.py), which the
    client chose: its line breaks are written as escapes, on the record's own line."""

    def broken(self, request, *args, **kwargs):
        raise RuntimeError("broken")

    monkeypatch.setattr(JobViewSet, "retrieve", broken)
    answer = api(staff).get("/api/v1/jobs/x" + quoted + FORGED.replace(" ", "%20") + "/")
    assert answer.status_code == 500
    lines = records(console.getvalue())
    assert not [line for line in lines if line.startswith(FORGED)], lines
    errors = [line for line in lines if "Internal Server Error" in line]
    assert errors and all(line.endswith(f"Internal Server Error: /api/v1/jobs/x{shown}{FORGED}/") for line in errors)


def test_a_multi_line_message_stays_one_record_and_a_traceback_stays_readable(console):
    try:
        raise ValueError("inner")
    except ValueError:
        logging.getLogger("apps.test").exception("first\n%s", FORGED)
    text = console.getvalue()
    assert f"first\\n{FORGED}" in text
    assert "Traceback (most recent call last):\n" in text and text.rstrip().endswith("ValueError: inner")


def test_an_exception_message_in_a_traceback_cannot_forge_a_log_line(console):
    """A traceback keeps its lines, but each exception's own message (which may quote a user's
    input or a provider's answer) is written on one line, in a chain too."""
    try:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError(f"bad input\r\n{FORGED}") from exc
    except ValueError:
        logging.getLogger("apps.test").exception("emulation 7 failed")
    lines = records(console.getvalue())
    assert not [line for line in lines if line.startswith(FORGED)], lines
    assert f"ValueError: bad input\\r\\n{FORGED}" in lines
    assert (
        "KeyError: 'inner'" in lines and "The above exception was the direct cause of the following exception:" in lines
    )
    assert lines.count("Traceback (most recent call last):") == 2 and any(line.startswith("  File ") for line in lines)


def test_an_exceptions_note_in_a_traceback_cannot_forge_a_log_line(console):
    """A note (``add_note``) that quotes a line break stays on its exception's line."""
    try:
        error = ValueError("bad input")
        error.add_note(f"while reading\n{FORGED}")
        raise error
    except ValueError:
        logging.getLogger("apps.test").exception("emulation 8 failed")
    lines = records(console.getvalue())
    assert not [line for line in lines if line.startswith(FORGED)], lines
    assert f"ValueError: bad input\\nwhile reading\\n{FORGED}" in lines


def test_a_message_in_an_exception_group_cannot_forge_a_log_line(console):
    """A group's traceback writes its members behind a margin (``    | ``): their messages and the
    group's own stay one line each, and its frames and separators are kept as they are."""
    try:
        inner = KeyError("k")
        inner.add_note(f"note\n{FORGED}")
        raise ExceptionGroup(f"batch\n{FORGED}", [ValueError(f"bad\n{FORGED}"), ExceptionGroup("inner", [inner])])
    except ExceptionGroup:
        logging.getLogger("apps.test").exception("batch 9 failed")
    lines = records(console.getvalue())
    assert not [
        line for line in lines if FORGED in line and not line.lstrip(" |").startswith(("Exception", "Value", "Key"))
    ]
    assert f"  | ExceptionGroup: batch\\n{FORGED} (2 sub-exceptions)" in lines
    assert f"    | ValueError: bad\\n{FORGED}" in lines
    assert f"      | KeyError: 'k'\\nnote\\n{FORGED}" in lines
    assert "  + Exception Group Traceback (most recent call last):" in lines


def test_djangos_records_are_written_by_the_root_handler_alone():
    """Django's own console handler (under DEBUG) wrote its records a second time, unescaped."""
    assert logging.getLogger("django").handlers == [] and logging.getLogger("django").propagate
