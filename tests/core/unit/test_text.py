"""``apps.core.text``: the checks every user- or operator-supplied value passes before a script
or a page shows it (R-BACK-6)."""

import pytest

from apps.core.text import has_control_characters, printable


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "\x00", "\x1b[31m", "\x7f", "\x85", "tab\there"])
def test_control_characters_are_found(value):
    assert has_control_characters(value)


@pytest.mark.parametrize("value", ["plain", "ümlaut ß", "spaces and $symbols", ""])
def test_text_without_control_characters_passes(value):
    assert not has_control_characters(value)


def test_a_shown_name_has_its_line_breaks_and_tabs_written_as_escapes():
    assert printable("a\nb\rc\td") == "a\\nb\\rc\\td"


def test_a_shown_name_has_its_other_control_characters_written_in_hex():
    assert printable("\x1b[0m") == "\\x1b[0m"


def test_a_bidirectional_control_cannot_reorder_a_shown_name():
    assert printable("report\u202ecod.exe") == "report\\u202ecod.exe"


def test_an_ordinary_name_is_shown_as_is():
    assert printable("résultats/run-1.txt") == "résultats/run-1.txt"


def test_a_unicode_line_separator_is_written_as_an_escape():
    assert printable("a\u2028b\u2029c\x85d") == "a\\u2028b\\u2029c\\x85d"
