"""Unit and property tests of the pure offset arithmetic in `pyspark_rmqs.offsets`."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    apply_limit,
    merge_committed_splits,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    proportional_budgets,
    rows_for_bytes,
    split_ranges,
)

stream_names = st.text(alphabet="abcdefgh-0123456789", min_size=1, max_size=8)
offsets_maps = st.dictionaries(stream_names, st.integers(min_value=0, max_value=2**63 - 1), max_size=8)


# --- JSON -----------------------------------------------------------------------------------------


def test_offsets_to_json_is_compact_and_sorted() -> None:
    assert offsets_to_json({"orders-1": 980, "orders-0": 1200}) == '{"orders-0":1200,"orders-1":980}'
    assert offsets_to_json({}) == "{}"


def test_offsets_to_json_rejects_non_int_values() -> None:
    with pytest.raises(ConfigurationError):
        offsets_to_json({"s": True})
    with pytest.raises(ConfigurationError):
        not_an_int: Any = 1.5
        offsets_to_json({"s": not_an_int})


def test_offsets_from_json_parses_and_keeps_sentinels() -> None:
    text = '{"orders-0": 1200, "orders-1": -1, "orders-2": -2, "orders-3": 0}'
    assert offsets_from_json(text) == {
        "orders-0": 1200,
        "orders-1": LATEST,
        "orders-2": EARLIEST,
        "orders-3": 0,
    }
    assert LATEST == -1 and EARLIEST == -2


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        "42",
        '"earliest"',
        "null",
        "not json",
        '{"s": true}',
        '{"s": 1.0}',
        '{"s": "42"}',
        '{"s": null}',
        '{"s": -3}',
        '{"": 1}',
        '{"s": 1, "s": 2}',
    ],
)
def test_offsets_from_json_rejects_bad_input(text: str) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        offsets_from_json(text, option="endingOffsets")
    message = str(excinfo.value)
    assert "endingOffsets" in message
    assert '{"stream-0": 42, ...}' in message


def test_offsets_from_json_default_option_name() -> None:
    with pytest.raises(ConfigurationError, match="startingOffsets"):
        offsets_from_json("[]")


@given(offsets_maps)
def test_json_round_trip(offsets: dict[str, int]) -> None:
    text = offsets_to_json(offsets)
    assert offsets_from_json(text) == offsets
    assert offsets_to_json(offsets_from_json(text)) == text
    assert list(json.loads(text)) == sorted(offsets)


# --- OffsetRange and plan_ranges ------------------------------------------------------------------


def test_offset_range_size() -> None:
    assert OffsetRange("s", 10, 15).size == 5
    assert not OffsetRange("s", 10, 15).is_empty
    assert OffsetRange("s", 10, 10).is_empty
    assert OffsetRange("s", 10, 5).size == 0
    assert OffsetRange("s", 10, 5).is_empty


def test_plan_ranges() -> None:
    starts = {"b": 0, "a": 5, "c": 7, "only-start": 0, "empty": 3}
    ends = {"a": 10, "b": 4, "c": 6, "only-end": 9, "empty": 3}
    assert plan_ranges(starts, ends) == [OffsetRange("a", 5, 10), OffsetRange("b", 0, 4)]


# --- split_ranges ---------------------------------------------------------------------------------


def test_split_ranges_unchanged_when_not_needed() -> None:
    ranges = [OffsetRange("b", 0, 10), OffsetRange("a", 0, 10)]
    assert split_ranges(ranges, None) == ranges
    assert split_ranges(ranges, 1) == ranges
    assert split_ranges(ranges, 2) == ranges


def test_split_ranges_single_stream_even() -> None:
    assert split_ranges([OffsetRange("s", 0, 100)], 4) == [
        OffsetRange("s", 0, 25),
        OffsetRange("s", 25, 50),
        OffsetRange("s", 50, 75),
        OffsetRange("s", 75, 100),
    ]


def test_split_ranges_proportional_with_minimum_one() -> None:
    ranges = [OffsetRange("b", 0, 10), OffsetRange("a", 0, 90)]
    assert split_ranges(ranges, 5) == [
        OffsetRange("a", 0, 23),
        OffsetRange("a", 23, 46),
        OffsetRange("a", 46, 68),
        OffsetRange("a", 68, 90),
        OffsetRange("b", 0, 10),
    ]


def test_split_ranges_never_makes_empty_splits() -> None:
    assert split_ranges([OffsetRange("s", 7, 10)], 10) == [
        OffsetRange("s", 7, 8),
        OffsetRange("s", 8, 9),
        OffsetRange("s", 9, 10),
    ]


def test_split_ranges_drops_empty_ranges_when_splitting() -> None:
    ranges = [OffsetRange("e", 5, 5), OffsetRange("s", 0, 4)]
    assert split_ranges(ranges, 2) == [OffsetRange("s", 0, 2), OffsetRange("s", 2, 4)]


@pytest.mark.parametrize("bad", [0, -1])
def test_split_ranges_rejects_non_positive(bad: int) -> None:
    with pytest.raises(ConfigurationError, match="minPartitions"):
        split_ranges([OffsetRange("s", 0, 10)], bad)


range_lists = st.dictionaries(
    stream_names,
    st.tuples(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=500)),
    max_size=6,
).map(lambda d: [OffsetRange(s, start, start + size) for s, (start, size) in d.items()])


@given(range_lists, st.integers(min_value=1, max_value=64))
def test_split_ranges_properties(ranges: list[OffsetRange], min_partitions: int) -> None:
    splits = split_ranges(ranges, min_partitions)
    non_empty = [r for r in ranges if not r.is_empty]
    if min_partitions <= len(non_empty):
        assert splits == ranges
        return
    assert all(not s.is_empty for s in splits)
    assert splits == sorted(splits, key=lambda r: (r.stream, r.start))
    for rng in non_empty:
        pieces = [s for s in splits if s.stream == rng.stream]
        assert pieces[0].start == rng.start
        assert pieces[-1].end == rng.end
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))  # contiguous
        sizes = [p.size for p in pieces]
        assert max(sizes) - min(sizes) <= 1
    assert {s.stream for s in splits} == {r.stream for r in non_empty}
    total = sum(r.size for r in non_empty)
    if total >= min_partitions:
        assert len(splits) >= min_partitions
    else:
        assert len(splits) == total


# --- proportional_budgets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "total", "expected"),
    [
        ({"a": 50, "b": 30, "c": 20}, 10, {"a": 5, "b": 3, "c": 2}),
        ({"a": 10, "b": 10, "c": 10}, 10, {"a": 4, "b": 3, "c": 3}),
        ({"a": 7, "b": 3}, 5, {"a": 4, "b": 1}),
        ({"a": 1000, "b": 1, "c": 0}, 10, {"a": 9, "b": 1, "c": 0}),
        ({"a": 100, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 1}),
        ({"a": 1, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 1}),
        ({"a": 3, "b": 0}, 100, {"a": 3, "b": 0}),
        ({"a": 3, "b": 4}, 7, {"a": 3, "b": 4}),
        ({"a": 5}, 0, {"a": 1}),
        ({}, 10, {}),
    ],
)
def test_proportional_budgets(pending: dict[str, int], total: int, expected: dict[str, int]) -> None:
    assert proportional_budgets(pending, total) == expected


def test_proportional_budgets_rejects_bad_input() -> None:
    with pytest.raises(ConfigurationError):
        proportional_budgets({"a": 1}, -1)
    with pytest.raises(ConfigurationError):
        proportional_budgets({"a": -1}, 1)


@given(
    st.dictionaries(stream_names, st.integers(min_value=0, max_value=10**9), max_size=10),
    st.integers(0, 10**10),
)
def test_proportional_budgets_properties(pending: dict[str, int], total: int) -> None:
    budgets = proportional_budgets(pending, total)
    assert budgets.keys() == pending.keys()
    non_empty = [s for s, p in pending.items() if p > 0]
    for stream, count in pending.items():
        assert 0 <= budgets[stream] <= count
        if count > 0:
            assert budgets[stream] >= 1
        else:
            assert budgets[stream] == 0
    pending_sum = sum(pending.values())
    if total >= len(non_empty):
        assert sum(budgets.values()) == min(total, pending_sum)
    else:
        assert sum(budgets.values()) == len(non_empty)
    if total >= pending_sum:
        assert budgets == pending


# --- merge_committed_splits -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "splits", "expected"),
    [
        (0, [(0, 100, 100), (100, 200, 100), (200, 300, 300)], 100),  # SPEC example
        (0, [(0, 100, 100), (100, 200, 200), (200, 300, 300)], 300),
        (0, [(200, 300, 300), (0, 100, 100), (100, 200, 200)], 300),  # order does not matter
        (0, [(0, 100, 100), (100, 200, 150), (200, 300, 300)], 150),  # partial split stops there
        (0, [(0, 100, 50), (0, 100, 100), (0, 100, 70)], 100),  # retries: best commit wins
        (0, [(0, 100, 100), (150, 200, 200)], 100),  # gap: missing split
        (100, [(0, 100, 100)], 100),  # nothing starts at base
        (100, [], 100),
        (0, [(0, 100, 0)], 0),  # failed first split
        (0, [(0, 100, 500)], 100),  # over-reported commit is clamped to end
        (10, [(10, 10, 10), (10, 20, 20)], 20),  # empty split ignored
    ],
)
def test_merge_committed_splits(base: int, splits: list[tuple[int, int, int]], expected: int) -> None:
    assert merge_committed_splits(base, splits) == expected


def test_merge_committed_splits_rejects_bad_input() -> None:
    with pytest.raises(ConfigurationError):
        merge_committed_splits(-1, [])
    with pytest.raises(ConfigurationError):
        merge_committed_splits(0, [(10, 5, 10)])


split_results = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 200), st.integers(-10, 300)).map(
        lambda t: (t[0], t[0] + t[1], t[0] + t[2])
    ),
    max_size=12,
)


@given(st.integers(0, 1000), split_results)
def test_merge_committed_splits_bounds(base: int, splits: list[tuple[int, int, int]]) -> None:
    merged = merge_committed_splits(base, splits)
    assert merged >= base
    assert merged <= max([base, *(end for _, end, _ in splits)])


@given(st.integers(0, 10**6), st.lists(st.integers(1, 1000), max_size=10), st.randoms())
def test_merge_committed_splits_all_done(base: int, sizes: list[int], rnd: random.Random) -> None:
    splits = []
    start = base
    for size in sizes:
        splits.append((start, start + size, start + size))
        start += size
    rnd.shuffle(splits)
    assert merge_committed_splits(base, splits) == start


# --- apply_limit and rows_for_bytes ---------------------------------------------------------------


def test_apply_limit_without_limit_reads_to_tails() -> None:
    starts = {"a": 0, "b": 10, "c": 5, "stale": 50}
    tails = {"a": 100, "b": 10, "d": 50, "stale": 40}
    assert apply_limit(starts, tails, None) == {"a": 100, "b": 10, "c": 5, "stale": 50}


def test_apply_limit_with_budget() -> None:
    starts = {"a": 0, "b": 10, "c": 5}
    tails = {"a": 100, "b": 10, "d": 50}
    assert apply_limit(starts, tails, 10) == {"a": 10, "b": 10, "c": 5}
    assert apply_limit({"a": 0, "b": 0}, {"a": 75, "b": 25}, 8) == {"a": 6, "b": 2}
    assert apply_limit({"a": 0, "b": 0}, {"a": 1000, "b": 1}, 1) == {"a": 1, "b": 1}


@pytest.mark.parametrize("bad", [0, -5])
def test_apply_limit_rejects_bad_limit(bad: int) -> None:
    with pytest.raises(ConfigurationError, match="maxRecordsPerTrigger"):
        apply_limit({"a": 0}, {"a": 1}, bad)


def test_apply_limit_rejects_unresolved_start() -> None:
    with pytest.raises(ConfigurationError):
        apply_limit({"a": LATEST}, {"a": 1}, None)


@given(offsets_maps, offsets_maps, st.one_of(st.none(), st.integers(1, 10**6)))
def test_apply_limit_properties(starts: dict[str, int], tails: dict[str, int], limit: int | None) -> None:
    ends = apply_limit(starts, tails, limit)
    assert ends.keys() == starts.keys()
    for stream, start in starts.items():
        assert ends[stream] >= start
        if stream in tails:
            assert ends[stream] <= max(start, tails[stream])
        else:
            assert ends[stream] == start


@pytest.mark.parametrize(
    ("max_bytes", "avg", "expected"),
    [(10_000, 1024.0, 9), (1024, 1024.0, 1), (10, 1000.0, 1), (100, 0.5, 100), (100, 0.0, 100), (5, 2.5, 2)],
)
def test_rows_for_bytes(max_bytes: int, avg: float, expected: int) -> None:
    assert rows_for_bytes(max_bytes, avg) == expected


def test_rows_for_bytes_rejects_non_positive() -> None:
    with pytest.raises(ConfigurationError, match="maxBytesPerTrigger"):
        rows_for_bytes(0, 10.0)
