"""Unit tests for durable.durations: the duration forms users may write."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durable.durations import optional_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("250ms", timedelta(milliseconds=250)),
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("3d", timedelta(days=3)),
    ],
)
def test_unit_strings_are_parsed(value: str, expected: timedelta) -> None:
    assert parse_duration(value) == expected


def test_fractional_unit_string_is_parsed() -> None:
    assert parse_duration("1.5s") == timedelta(seconds=1.5)


def test_surrounding_whitespace_in_string_is_ignored() -> None:
    assert parse_duration(" 30 s ") == timedelta(seconds=30)


def test_zero_string_is_zero() -> None:
    assert parse_duration("0s") == timedelta(0)


def test_int_is_seconds() -> None:
    assert parse_duration(90) == timedelta(seconds=90)


def test_float_is_seconds() -> None:
    assert parse_duration(0.25) == timedelta(milliseconds=250)


def test_timedelta_is_returned_unchanged() -> None:
    value = timedelta(minutes=7, seconds=3)
    assert parse_duration(value) == value


def test_optional_duration_passes_none_through() -> None:
    assert optional_duration(None) is None


def test_optional_duration_parses_a_value() -> None:
    assert optional_duration("2h") == timedelta(hours=2)


@pytest.mark.parametrize("value", ["soon", "", "30", "1w", "s", "5 minutes", "1e3s", "-5s"])
def test_bad_string_raises_value_error_listing_accepted_forms(value: str) -> None:
    with pytest.raises(ValueError, match='e.g. "250ms", "30s", "5m", "2h", "3d"'):
        parse_duration(value)


def test_bad_string_error_names_what_was_parsed() -> None:
    with pytest.raises(ValueError, match=r"^LEASE: 'soon' is not a duration"):
        parse_duration("soon", what="LEASE")


@pytest.mark.parametrize("value", [-1, -0.5, timedelta(seconds=-1)])
def test_negative_duration_raises_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_duration(value, what="timeout")


@pytest.mark.parametrize("value", [True, False])
def test_bool_is_refused_although_it_is_an_int(value: bool) -> None:
    with pytest.raises(ValueError, match=f"timeout: expected a duration, got {value!r}"):
        parse_duration(value, what="timeout")


@pytest.mark.parametrize("value", [None, [30], {"seconds": 30}, b"30s"])
def test_other_types_raise_value_error_naming_the_type(value: object) -> None:
    with pytest.raises(ValueError, match=f"expected a duration, got {type(value).__name__}"):
        parse_duration(value)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**20, "1000000000d"])
def test_out_of_range_duration_raises_clear_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="LEASE"):
        parse_duration(value, what="LEASE")
