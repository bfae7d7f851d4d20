"""Providers' duration fields, read by one parser (``apps.backends.base.duration_seconds``)."""

import pytest

from apps.backends.base import duration_seconds


@pytest.mark.parametrize(
    ("text", "mark", "seconds"),
    [
        ("1-02:03:04", "-", 93784),  # Slurm, with days
        ("5:07", "-", 307),  # Slurm M:SS
        ("00:00:09", "-", 9),
        ("1.02:03:04.5000000", ".", 93784.5),  # Qarnot's TimeSpan, with days and a fraction
        ("00:01:30.2500000", ".", 90.25),
        ("42", ".", 42),
    ],
)
def test_a_providers_duration_reads_as_seconds(text, mark, seconds):
    assert duration_seconds(text, mark) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "UNLIMITED", "INVALID", "NOT_SET", "x-01:00:00", "1:xx", "  "])
def test_what_is_not_a_duration_reads_as_unknown_never_an_error(text):
    assert duration_seconds(text, "-") is None
