"""Offset-range partition keys: format, parsing, merging into few reads."""

import pytest

from dagster_rmqs import (
    OffsetRange,
    merge_offset_ranges,
    offset_range_key,
    parse_offset_range_key,
    range_layers,
    range_run_key,
)
from pyspark_rmqs.core.errors import ConfigurationError

pytestmark = pytest.mark.dagster


def test_keys_are_padded_sortable_and_round_trip() -> None:
    key = offset_range_key("orders-0", 1200, 1500)
    assert key == "orders-0:000000001200-000000001500"
    assert parse_offset_range_key(key) == OffsetRange("orders-0", 1200, 1500)
    assert parse_offset_range_key("a:b:c-1:7-9") == OffsetRange("a:b:c-1", 7, 9)  # ':' and '-' in names
    keys = [offset_range_key("s", a, b) for a, b in [(900, 1000), (10, 900), (1000, 20000)]]
    assert [parse_offset_range_key(k).start for k in sorted(keys)] == [10, 900, 1000]
    assert "," not in key


@pytest.mark.parametrize("key", ["orders-0", "orders-0:5-5", "orders-0:9-3", ":1-2", "s:x-2"])
def test_bad_keys_fail_with_the_expected_form(key: str) -> None:
    with pytest.raises(ConfigurationError, match="expected '<stream>:<start>-<end>'"):
        parse_offset_range_key(key)


def test_unrepresentable_ranges_fail() -> None:
    with pytest.raises(ConfigurationError, match="cannot be part"):
        offset_range_key("a,b", 0, 1)
    with pytest.raises(ConfigurationError, match="start < end"):
        offset_range_key("a", 3, 3)


def test_contiguous_selections_merge_into_one_read_and_gaps_add_reads() -> None:
    k = offset_range_key
    keys = [k("p0", 30, 60), k("p0", 0, 30), k("p1", 5, 9), k("p0", 50, 70)]
    assert merge_offset_ranges(keys) == {"p0": [(0, 70)], "p1": [(5, 9)]}
    assert range_layers(keys) == [{"p0": (0, 70), "p1": (5, 9)}]
    gappy = [k("p0", 0, 10), k("p0", 20, 30), k("p1", 0, 5)]
    assert range_layers(gappy) == [{"p0": (0, 10), "p1": (0, 5)}, {"p0": (20, 30)}]
    assert range_layers([]) == []
    assert range_run_key({"p1": (3, 4), "p0": (0, 2), "p2": (5, 5)}) == f"{k('p0', 0, 2)},{k('p1', 3, 4)}"
