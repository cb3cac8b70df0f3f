"""--time-budget reads durations as people write them: a unitless number after hours is
minutes ('1h30' is an hour and a half, as '1h30m'), after minutes it is seconds."""

from __future__ import annotations

import pytest

from macspec.errors import MacspecError
from macspec.tune.config import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h30", 5400),
        ("1h30m", 5400),
        ("1h30s", 3630),
        ("2m30", 150),
        ("1h5m30", 3930),
        ("90", 90),
        ("1.5h", 5400),
    ],
)
def test_durations_read_as_written(text: str, seconds: float):
    assert parse_duration(text) == seconds


def test_an_hour_and_a_half_is_said_back_as_one():
    assert format_duration(parse_duration("1h30")) == "1 h 30 min"


@pytest.mark.parametrize("text", ["", "h30", "1x", "30s10", "0h0"])
def test_anything_else_is_one_line(text: str):
    with pytest.raises(MacspecError, match="--time-budget must be"):
        parse_duration(text)
