"""Unit and property tests of the pure offset arithmetic in `pyspark_rmqs.core.offsets`."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rmqs.broker.client import AsyncBrokerClient
from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.offsets import (
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
    with pytest.raises(
        ConfigurationError, match=r"offsets must map stream names to integers, .*got 's': True$"
    ):
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
    with pytest.raises(ConfigurationError, match=r"^option 'startingOffsets' must be a JSON object;"):
        offsets_from_json("[]")


_FORM = 'expected a JSON object of partition stream name to next offset, like {"stream-0": 42, ...}'


@pytest.mark.parametrize(
    ("text", "kwargs", "reason", "sentinels"),
    [
        (42, {}, "must be a JSON string, got int", "-1 (latest) or -2 (earliest)"),
        ("[1]", {}, "must be a JSON object", "-1 (latest) or -2 (earliest)"),
        ("{}", {"empty": False}, "must be a non-empty JSON object", "-1 (latest) or -2 (earliest)"),
        ('{"": 1}', {}, "has an empty stream name", "-1 (latest) or -2 (earliest)"),
        ('{"s": "4"}', {}, "has a non-integer offset for stream 's': \"4\"", "-1 (latest) or -2 (earliest)"),
        ('{"s": -3}', {}, "has an invalid offset -3 for stream 's'", "-1 (latest) or -2 (earliest)"),
        ('{"s": -2}', {"earliest": False}, "has an invalid offset -2 for stream 's'", "-1 (latest)"),
    ],
)
def test_offsets_from_json_messages(text: Any, kwargs: dict[str, Any], reason: str, sentinels: str) -> None:
    """The whole message: the option, the reason, the expected form and the sentinels allowed here."""
    with pytest.raises(ConfigurationError) as excinfo:
        offsets_from_json(text, "endingOffsets", **kwargs)
    assert str(excinfo.value) == f"option 'endingOffsets' {reason}; {_FORM} (offsets >= 0, or {sentinels})"


def test_offsets_from_json_empty_object_is_allowed_by_default() -> None:
    assert offsets_from_json("{}") == {}
    assert offsets_from_json('{"s": -1}', earliest=False) == {"s": LATEST}


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
    with pytest.raises(ConfigurationError, match=r"^record budget must be an integer >= 0, got -1$"):
        proportional_budgets({"a": 1}, -1)
    with pytest.raises(
        ConfigurationError, match=r"^pending count of stream 'a' must be an int >= 0, got -1$"
    ):
        proportional_budgets({"a": -1}, 1)


@pytest.mark.parametrize(
    ("pending", "total", "expected"),
    [
        # shares 1.2 and 1.8: floors 1 and 1, the leftover goes to the larger remainder (b's .8)
        ({"a": 2, "b": 3}, 3, {"a": 1, "b": 2}),
        # shares 1.6 and 2.4: floors 1 and 2, the leftover goes to a (.6 beats .4), not to the larger count
        ({"a": 2, "b": 3}, 4, {"a": 2, "b": 2}),
        # shares .56, 1.67, 2.78: floors 0, 1, 2 and the 2 leftovers go to c and b; a gets its minimum
        # of 1, taken back from the largest budget (c), not from the first name or the smallest
        ({"a": 1, "b": 3, "c": 5}, 5, {"a": 1, "b": 2, "c": 2}),
        ({"a": 3, "b": 3}, 6, {"a": 3, "b": 3}),  # total == pending: exactly the pending
    ],
)
def test_proportional_budgets_largest_remainder_and_donors(
    pending: dict[str, int], total: int, expected: dict[str, int]
) -> None:
    assert proportional_budgets(pending, total) == expected


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
        (0, [(0, 100, 100), (100, 200, 100), (200, 300, 300)], 100),  # SPEC example: [100,200) failed
        (0, [(0, 100, 100), (100, 200, 200), (200, 300, 300)], 300),
        (0, [(200, 300, 300), (0, 100, 100), (100, 200, 200)], 300),  # out of order results
        (0, [(100, 200, 200), (0, 100, 100)], 200),  # out of order, two splits
        # A partially committed split does not advance the checkpoint: the retry re-reads it whole.
        (0, [(0, 100, 100), (100, 200, 150), (200, 300, 300)], 100),
        (0, [(0, 100, 99)], 0),
        (0, [(0, 100, 99), (100, 200, 200)], 0),
        # Retries: duplicate ranges with different commits, the max per range wins, in any order.
        (0, [(0, 100, 50), (0, 100, 100), (0, 100, 70)], 100),
        (0, [(0, 100, 100), (0, 100, 0), (100, 200, 120), (100, 200, 200), (100, 200, 100)], 200),
        (0, [(0, 100, 100), (100, 200, 150), (100, 200, 180)], 100),  # no retry finished [100,200)
        (0, [(0, 100, 100), (150, 200, 200)], 100),  # gap: [100,150) missing
        (0, [(50, 100, 100)], 0),  # gap at the base
        (5, [(5, 10, 10), (11, 20, 20)], 10),  # gap of one offset
        (100, [(0, 100, 100)], 100),  # nothing starts at base
        (100, [(0, 100, 100), (100, 200, 200)], 100),  # a split before base stops the merge (literal SPEC)
        (0, [(0, 100, 100), (50, 150, 150)], 100),  # overlap: [50,150) does not start at 100
        (0, [(0, 50, 50), (0, 100, 100)], 50),  # same start: sorted by end, then [0,100) != 50
        (100, [], 100),
        (0, [], 0),
        (0, [(0, 100, 0)], 0),  # failed first split
        (10, [(10, 10, 10), (10, 20, 20)], 20),  # empty split at the base
        (7, [(7, 8, 8)], 8),
    ],
)
def test_merge_committed_splits(base: int, splits: list[tuple[int, int, int]], expected: int) -> None:
    assert merge_committed_splits(base, splits) == expected


@pytest.mark.parametrize(
    ("base", "splits", "match"),
    [
        (-1, [], "base offset must be an integer >= 0, got -1"),
        (True, [], "base offset"),
        (1.0, [], "base offset"),
        (0, [(10, 5, 10)], r"split range \[10, 5\) is not a range"),
        (0, [(0, 5.0, 5)], "not a range of integer offsets"),
        (0, [(0, 5, True)], "not a range of integer offsets"),
        (0, [(0, 100, 500)], r"reports committed offset 500, outside \[0, 100\]"),
        (0, [(10, 100, 9)], r"committed offset 9, outside \[10, 100\]"),
    ],
)
def test_merge_committed_splits_rejects_bad_input(base: Any, splits: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        merge_committed_splits(base, splits)


def test_merge_committed_splits_accepts_committed_at_the_bounds() -> None:
    assert merge_committed_splits(0, [(0, 100, 0)]) == 0  # committed == start: nothing done
    assert merge_committed_splits(0, [(0, 100, 100)]) == 100  # committed == end: all done
    assert merge_committed_splits(3, [(3, 3, 3)]) == 3  # an empty split


split_results = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 200), st.integers(0, 200)).map(
        lambda t: (t[0], t[0] + t[1], t[0] + min(t[1], t[2]))
    ),
    max_size=12,
)


def _reference_merge(base: int, splits: list[tuple[int, int, int]]) -> int:
    """SPEC's algorithm written out once more, independently, for the property test."""
    ranges = {(s, e) for s, e, _ in splits}
    results = [(s, e, max(c for s2, e2, c in splits if (s2, e2) == (s, e))) for s, e in ranges]
    for s, e, c in sorted(results):
        if s == base and c == e:
            base = e
        else:
            return base
    return base


@given(st.integers(0, 1000), split_results)
def test_merge_committed_splits_properties(base: int, splits: list[tuple[int, int, int]]) -> None:
    merged = merge_committed_splits(base, splits)
    assert merged == _reference_merge(base, splits)
    assert merged >= base
    assert merged <= max([base, *(end for _, end, _ in splits)])
    # The merged position is covered by fully committed splits only: no offset in [base, merged) is
    # outside a finished split, so nothing is skipped.
    done = [(s, e) for s, e, c in splits if c == e]
    assert all(any(s <= o < e for s, e in done) for o in range(base, merged))


@given(st.integers(0, 10**6), st.lists(st.integers(1, 1000), max_size=10), st.randoms())
def test_merge_committed_splits_all_done(base: int, sizes: list[int], rnd: random.Random) -> None:
    splits = []
    start = base
    for size in sizes:
        splits.append((start, start + size, start + size))
        start += size
    rnd.shuffle(splits)
    assert merge_committed_splits(base, splits) == start


@given(
    st.integers(0, 10**6),
    st.lists(st.integers(1, 1000), min_size=1, max_size=10),
    st.data(),
    st.randoms(),
)
def test_merge_committed_splits_stops_at_the_first_unfinished_split(
    base: int, sizes: list[int], data: st.DataObject, rnd: random.Random
) -> None:
    splits = []
    start = base
    for size in sizes:
        splits.append((start, start + size, start + size))
        start += size
    broken = data.draw(st.integers(0, len(splits) - 1))
    s, e, _ = splits[broken]
    splits[broken] = (s, e, data.draw(st.integers(s, e - 1)))  # partially committed, or not at all
    rnd.shuffle(splits)
    assert merge_committed_splits(base, splits) == s


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
    with pytest.raises(ConfigurationError, match=r"^start offset of stream 'a' must be an int >= 0, got -1$"):
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
    assert rows_for_bytes(1, 1.0) == 1  # 1 byte is a valid budget


@pytest.mark.parametrize("avg", [float("inf"), float("-inf"), float("nan")])
def test_rows_for_bytes_with_a_non_finite_average_assumes_one_byte(avg: float) -> None:
    assert rows_for_bytes(100, avg) == 100


# --- the streaming runner commits the merge of a batch's splits -----------------------------------


class _FakeClient:
    def __init__(self) -> None:
        self.stored: list[tuple[str, dict[str, int]]] = []

    def store_offsets_forward(self, consumer: str, offsets: dict[str, int]) -> dict[str, int]:
        # The runner's only store: a raw `store_offsets` (which can move a watermark back) fails here.
        self.stored.append((consumer, dict(offsets)))
        return {}


class _FakeMeta:
    """What the runner's `_Metadata` answers: first offsets and tails, no broker."""

    def __init__(self, firsts: dict[str, int], tails: dict[str, int]) -> None:
        self.firsts, self.tails = firsts, tails
        self.client = _FakeClient()
        self.sizes: dict[str, float] = {}

    def refresh(self, force: bool = False) -> tuple[dict[str, int], dict[str, int]]:
        return self.firsts, self.tails


def _runner(firsts: dict[str, int], tails: dict[str, int], **options: str) -> Any:
    from pyspark_rmqs.options import parse_source_options
    from pyspark_rmqs.spark.streaming import RabbitMQStreamsStreamReader

    opts = {"endpoints": "localhost:5552", "superstream": "orders", "consumerName": "etl", **options}
    reader = RabbitMQStreamsStreamReader(parse_source_options(opts, streaming=True))
    reader._meta = _FakeMeta(firsts, tails)  # type: ignore[assignment]
    return reader


@pytest.fixture
def merge_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """Spy on the one merge function: the runner must call it, not a copy of its own."""
    from pyspark_rmqs.core import offsets

    calls: list[tuple[int, list[tuple[int, int, int]]]] = []
    real = offsets.merge_committed_splits

    def spy(base: int, splits: list[tuple[int, int, int]]) -> int:
        calls.append((base, sorted(splits)))
        return real(base, splits)

    monkeypatch.setattr(offsets, "merge_committed_splits", spy)
    return calls


def test_runner_commit_merges_the_planned_splits(merge_calls: list[Any]) -> None:
    r = _runner({"o-0": 0, "o-1": 0}, {"o-0": 300, "o-1": 50}, minPartitions="4")
    parts = r.partitions({"o-0": 0, "o-1": 40}, {"o-0": 300, "o-1": 50})
    assert sorted((p.stream, p.start, p.end) for p in parts) == [
        ("o-0", 0, 100),
        ("o-0", 100, 200),
        ("o-0", 200, 300),
        ("o-1", 40, 50),
    ]
    r.commit({"o-0": 300, "o-1": 50})
    assert sorted(merge_calls) == [
        (0, [(0, 100, 100), (100, 200, 200), (200, 300, 300)]),
        (40, [(40, 50, 50)]),
    ]
    assert r.meta.client.stored == [("etl", {"o-0": 299, "o-1": 49})]
    assert r._plans == {}, "a committed batch's plan is forgotten"


def test_runner_commit_of_a_batch_it_did_not_plan_stores_the_end(merge_calls: list[Any]) -> None:
    r = _runner({"o-0": 0}, {"o-0": 300}, minPartitions="3")  # a restarted runner: no partitions() call
    r.commit({"o-0": 300})
    assert merge_calls == []
    assert r.meta.client.stored == [("etl", {"o-0": 299})]


def test_runner_commit_stops_at_a_split_missing_from_the_plan(caplog: pytest.LogCaptureFixture) -> None:
    r = _runner({"o-0": 0}, {"o-0": 300}, minPartitions="3")
    r.partitions({"o-0": 0}, {"o-0": 300})
    starts, splits = r._plans['{"o-0":300}']
    r._plans['{"o-0":300}'] = (starts, [x for x in splits if x.start != 100])  # [100, 200) lost
    assert r.committed_offsets({"o-0": 300}) == {"o-0": 100}
    assert "merge to 100, not its end 300" in caplog.text


def test_runner_commit_of_streams_without_splits_and_of_empty_batches() -> None:
    r = _runner({"o-0": 0, "o-1": 0}, {"o-0": 10, "o-1": 7})
    assert r.partitions({"o-0": 10, "o-1": 5}, {"o-0": 10, "o-1": 7}) != []
    assert r.committed_offsets({"o-0": 10, "o-1": 7}) == {"o-0": 10, "o-1": 7}
    assert r.partitions({"o-0": 0}, {"o-0": 0}) == []
    r.commit({"o-0": 0})
    assert r.meta.client.stored == [], "nothing read yet: nothing to store (no offset -1)"


def test_runner_forgets_older_plans_and_keeps_a_bounded_number() -> None:
    from pyspark_rmqs.spark.streaming import MAX_PLANS

    r = _runner({"o-0": 0}, {"o-0": 10_000})
    for end in range(1, MAX_PLANS + 6):
        r.partitions({"o-0": end - 1}, {"o-0": end})
    assert len(r._plans) == MAX_PLANS
    assert '{"o-0":5}' not in r._plans and '{"o-0":6}' in r._plans
    r.commit({"o-0": 10})
    assert sorted(json.loads(k)["o-0"] for k in r._plans) == list(range(11, MAX_PLANS + 6))
    r.partitions({"o-0": 11}, {"o-0": 30})  # planned again with another end: the latest plan counts
    assert r.committed_offsets({"o-0": 30}) == {"o-0": 30}
    assert r.__getstate__()["_plans"] == {}, "plans stay on the driver"


def test_runner_commit_stores_nothing_without_tracking() -> None:
    r = _runner({"o-0": 0}, {"o-0": 300}, serverSideOffsetTracking="false")
    r.partitions({"o-0": 0}, {"o-0": 300})
    r.commit({"o-0": 300})
    assert r.meta.client.stored == []
    assert r._plans == {}, "the plan is forgotten all the same"


# --- planning: positions and source options to offsets --------------------------------------------


class _TimestampClient:
    """Answers `offset_for_timestamp` as offset = millis // 1000, and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def offset_for_timestamp(self, stream: str, millis: int) -> int:
        self.calls.append((stream, millis))
        return millis // 1000

    def oldest_chunks(self, streams: list[str]) -> dict[str, tuple[int, int] | None]:
        """The oldest chunk kept starts at the first offset, written at the time that offset maps to."""
        return {s: (_BOUNDS["first"][s], _BOUNDS["first"][s] * 1000) for s in streams}


_BOUNDS = {"first": {"o-0": 10, "o-1": 20}, "tail": {"o-0": 100, "o-1": 200}}


def _source(**options: str) -> Any:
    from pyspark_rmqs.options import parse_source_options

    return parse_source_options(
        {"endpoints": "localhost:5552", "superstream": "o", **options}, streaming=False
    )


@pytest.mark.parametrize(
    ("options", "start", "end"),
    [
        ({}, {"o-0": 10, "o-1": 20}, {"o-0": 100, "o-1": 200}),
        ({"startingOffsets": "latest"}, {"o-0": 100, "o-1": 200}, {"o-0": 100, "o-1": 200}),
        (
            {
                "startingOffsets": "offset",
                "startingOffset": "50",
                "endingOffsets": "offset",
                "endingOffset": "70",
            },
            {"o-0": 50, "o-1": 50},
            {"o-0": 70, "o-1": 70},
        ),
        # Streams the JSON does not name start at their first offset and end at their tail.
        (
            {"startingOffsets": '{"o-0": 30}', "endingOffsets": '{"o-1": 150}'},
            {"o-0": 30, "o-1": 20},
            {"o-0": 100, "o-1": 150},
        ),
        ({"startingOffsets": '{"o-0": -1, "o-1": -2}'}, {"o-0": 100, "o-1": 20}, {"o-0": 100, "o-1": 200}),
        ({"startingOffsets": "timestamp", "startingTimestamp": "42000"}, {"o-0": 42, "o-1": 42}, None),
    ],
)
def test_starting_and_ending_offsets_from_source_options(
    options: dict[str, str], start: dict[str, int], end: dict[str, int] | None
) -> None:
    from pyspark_rmqs.broker.positions import Bounds, ending_offsets, starting_offsets

    b = Bounds(**_BOUNDS)
    client = _TimestampClient()
    assert starting_offsets(client, _source(**options), b) == start  # type: ignore[arg-type]
    if end is not None:
        assert ending_offsets(_source(**options), b) == end
    if "startingTimestamp" in options:
        assert client.calls == [("o-0", 42000), ("o-1", 42000)]


def test_ending_offsets_beyond_the_tail_read_to_the_tail(caplog: pytest.LogCaptureFixture) -> None:
    from pyspark_rmqs.broker.positions import Bounds, ending_offsets

    caplog.set_level("INFO", logger="pyspark_rmqs.broker.positions")
    b = Bounds(**_BOUNDS)
    assert ending_offsets(_source(endingOffsets='{"o-0": 100, "o-1": 250}'), b) == {"o-0": 100, "o-1": 200}
    assert [r.getMessage() for r in caplog.records] == [
        "endingOffsets for 'o-1' is 250, beyond the tail 200: reading to the tail"
    ], "an end at the tail is not beyond it"


def test_resolve_positions_watermark_and_its_fallback() -> None:
    from pyspark_rmqs.broker.positions import Bounds, resolve_positions

    b = Bounds(**_BOUNDS)
    stored = {"o-0": 41, "o-1": None}
    assert resolve_positions(None, b, "watermark", is_end=False, stored=stored) == {"o-0": 42, "o-1": 20}
    latest = resolve_positions(None, b, "watermark", is_end=False, stored=stored, fallback="latest")
    assert latest == {"o-0": 42, "o-1": 200}
    with pytest.raises(ConfigurationError) as e:
        resolve_positions(None, b, "watermark", is_end=False)
    assert str(e.value) == "start='watermark' needs a consumer_name (whose stored offset is the watermark)"


@pytest.mark.parametrize(
    ("pos", "is_end", "message"),
    [
        ('{"o-0": -3}', True, "option 'end' has an invalid offset -3 for stream 'o-0'"),
        ('{"o-0": -3}', False, "option 'start' has an invalid offset -3 for stream 'o-0'"),
        (1_700_000_000_000, True, "an end cannot be a timestamp here"),
        (1_700_000_000_000, False, "a start cannot be a timestamp here"),
        ("watermark", True, "end must be 'latest', offsets JSON/dict or a timestamp; got 'watermark'"),
        (
            "soon",
            False,
            "start must be 'watermark', 'earliest', 'latest', offsets JSON/dict or a timestamp; got 'soon'",
        ),
    ],
)
def test_resolve_positions_errors(pos: Any, is_end: bool, message: str) -> None:
    from pyspark_rmqs.broker.positions import Bounds, resolve_positions

    with pytest.raises(ConfigurationError) as e:
        resolve_positions(None, Bounds(**_BOUNDS), pos, is_end=is_end)
    assert str(e.value).startswith(message)


class _MetaClient:
    """The metadata calls planning makes, answered from memory."""

    def __init__(self, version: str = "4.0.5", parts: list[str] | None = None) -> None:
        self.version, self.parts = version, parts or []
        self.streams = {"orders"}

    def broker_version(self) -> str:
        return self.version

    def partitions(self, superstream: str) -> list[str]:
        return list(self.parts) if superstream == "o" else []

    def stream_exists(self, stream: str) -> bool:
        return stream in self.streams

    def bounds(self, streams: Any) -> dict[str, tuple[int, int] | None]:
        known = {"o-0": (10, 100), "o-1": (20, 200)}
        return {s: known.get(s) for s in streams}

    def stored_offsets(self, consumer: str, streams: list[str]) -> dict[str, int | None]:
        return {s: (41 if s == "o-0" and consumer == "etl" else None) for s in streams}


def test_clamp_to_retention(caplog: pytest.LogCaptureFixture) -> None:
    from pyspark_rmqs.broker.positions import Bounds, clamp_to_retention
    from pyspark_rmqs.core.errors import DataLossError

    b = Bounds(**_BOUNDS)
    starts = {"o-0": 10, "o-1": 15, "gone": 3}
    with pytest.raises(DataLossError) as e:
        clamp_to_retention(starts, b, True)
    assert str(e.value).startswith(
        "offsets [15, 20) of stream 'o-1' are lost (5 offsets): retention removed them"
    )
    assert clamp_to_retention(starts, b, False) == {"o-0": 10, "o-1": 20, "gone": 3}
    assert "offsets [15, 20) of stream 'o-1' are lost (5 offsets)" in caplog.text
    assert "o-0" not in caplog.text, "a start at the first offset lost nothing"


def test_check_version() -> None:
    from pyspark_rmqs.broker.positions import check_version
    from pyspark_rmqs.core.errors import UnsupportedBrokerError

    assert check_version(_MetaClient("3.11.0"), superstream=True) == "3.11.0"  # type: ignore[arg-type]
    assert check_version(_MetaClient("3.10.9")) == "3.10.9"  # type: ignore[arg-type]
    with pytest.raises(UnsupportedBrokerError) as e:
        check_version(_MetaClient("3.10.9"), superstream=True)  # type: ignore[arg-type]
    assert str(e.value) == "super streams need RabbitMQ 3.11 or newer; the broker is 3.10.9"
    with pytest.raises(UnsupportedBrokerError, match=r"^super streams need"):
        check_version(_MetaClient("3.10.9"), _source())  # type: ignore[arg-type]
    filtered = _source(filterValues="eu")
    assert check_version(_MetaClient("3.13.0"), filtered) == "3.13.0"  # type: ignore[arg-type]
    with pytest.raises(UnsupportedBrokerError) as e:
        check_version(_MetaClient("3.12.1"), filtered)  # type: ignore[arg-type]
    assert str(e.value) == (
        "option 'filterValues' needs RabbitMQ 3.13 or newer (stream filtering); the broker is 3.12.1"
    )


def test_partition_streams_bounds_and_stored_starts() -> None:
    from pyspark_rmqs.broker.positions import bounds, partition_streams, stored_starts
    from pyspark_rmqs.core.errors import ConfigurationError as Conf
    from pyspark_rmqs.core.errors import DataLossError, StreamNotFoundError
    from pyspark_rmqs.options import parse_source_options

    c: Any = _MetaClient(parts=["o-1", "o-0"])
    assert partition_streams(c, _source()) == ["o-1", "o-0"]  # the broker's order
    with pytest.raises(Conf, match="'nope'"):
        partition_streams(c, _source(startingOffsets='{"nope": 1}'))
    single = parse_source_options({"endpoints": "localhost:5552", "stream": "orders"}, streaming=False)
    assert partition_streams(c, single) == ["orders"]
    missing = parse_source_options({"endpoints": "localhost:5552", "stream": "other"}, streaming=False)
    with pytest.raises(StreamNotFoundError) as e:
        partition_streams(c, missing)
    assert str(e.value) == "stream 'other' does not exist (option 'stream')"
    b = bounds(c, ["o-0", "o-1"])
    assert (b.first, b.tail) == ({"o-0": 10, "o-1": 20}, {"o-0": 100, "o-1": 200})
    with pytest.raises(DataLossError, match=r"^partition stream 'o-9' no longer exists"):
        bounds(c, ["o-0", "o-9"])
    b = bounds(c, ["o-0", "o-9"], fail_on_data_loss=False)
    assert (b.first, b.tail) == ({"o-0": 10}, {"o-0": 100})
    assert stored_starts(c, "etl", ["o-0", "o-1"]) == {"o-0": 42, "o-1": None}  # stored + 1


# --- watermarks: the arithmetic and the plan/store protocol, over an in-memory broker --------------


_CONN: Any = object()


class _Tracking:
    """An in-memory AsyncBrokerClient: stored offsets per (reference, stream), bounds, partitions."""

    stored: dict[tuple[str, str], int] = {}
    stores: list[tuple[str, dict[str, int]]] = []
    after_store: dict[tuple[str, str], int] = {}  # what a concurrent run overwrites right after a store

    def __init__(self, conn: Any, **_: Any) -> None:
        assert conn is _CONN, "the caller's connection is the one used"

    async def partitions(self, name: str) -> list[str]:
        return ["o-0", "o-1"] if name == "o" else []

    async def stream_exists(self, name: str) -> bool:
        return name == "single"

    async def bounds(self, s: str) -> tuple[int, int]:
        return {"o-0": (10, 100), "o-1": (20, 200), "single": (0, 5)}[s]

    async def stored_offset(self, consumer: str, s: str) -> int | None:
        return self.stored.get((consumer, s))

    async def watermark_rows(
        self, streams: list[str], consumer: str, **_: Any
    ) -> list[tuple[int, int, int | None]]:
        return [(*(await self.bounds(s)), self.stored.get((consumer, s))) for s in streams]

    async def stored_offsets(self, consumer: str, streams: list[str]) -> dict[str, int | None]:
        return {s: self.stored.get((consumer, s)) for s in streams}

    # The real never-backwards rule, over this fake's stored_offsets / store_offsets.
    store_offsets_forward = AsyncBrokerClient.store_offsets_forward

    async def store_offsets(self, consumer: str, offsets: dict[str, int]) -> None:
        if not offsets:
            return
        type(self).stores.append((consumer, dict(offsets)))
        for s, o in offsets.items():
            self.stored[(consumer, s)] = o
        self.stored.update(self.after_store)


@pytest.fixture
def tracking(monkeypatch: pytest.MonkeyPatch) -> type[_Tracking]:
    from pyspark_rmqs.runs import watermarks

    monkeypatch.setattr(_Tracking, "stored", {})
    monkeypatch.setattr(_Tracking, "stores", [])
    monkeypatch.setattr(_Tracking, "after_store", {})
    monkeypatch.setattr(watermarks, "AsyncBrokerClient", _Tracking)
    return _Tracking


def test_partition_watermark_arithmetic() -> None:
    from pyspark_rmqs.runs.watermarks import PartitionWatermark, Watermarks

    fresh = PartitionWatermark("o-0", 10, 100, None)
    assert (fresh.next_offset, fresh.lag, fresh.lost) == (10, 90, 0)
    behind = PartitionWatermark("o-1", 20, 200, 49)
    assert (behind.next_offset, behind.lag, behind.lost) == (50, 150, 0)
    overtaken = PartitionWatermark("o-2", 60, 70, 49)  # retention removed [50, 60) before it was read
    assert (overtaken.next_offset, overtaken.lag, overtaken.lost) == (60, 10, 10)
    done = PartitionWatermark("o-3", 0, 80, 79)
    assert (done.next_offset, done.lag, done.lost) == (80, 0, 0)
    at_floor = PartitionWatermark("o-4", 50, 80, 49)
    assert (at_floor.next_offset, at_floor.lost) == (50, 0)
    w = Watermarks("o", "etl", True, (fresh, behind, overtaken, done))
    assert w.total_lag == 90 + 150 + 10
    assert w.pending() == {"o-0": (10, 100), "o-1": (50, 200), "o-2": (60, 70)}
    assert w.tails() == {"o-0": 100, "o-1": 200, "o-2": 70, "o-3": 80}
    d = w.to_dict()
    assert (d["target"], d["consumer"], d["superstream"], d["total_lag"]) == ("o", "etl", True, 250)
    assert d["partitions"][1] == {
        "stream": "o-1",
        "first": 20,
        "tail": 200,
        "stored": 49,
        "next_offset": 50,
        "lag": 150,
    }


def test_watermarks_after_and_lease_names() -> None:
    from pyspark_rmqs.runs.lease import MAX_NAME_BYTES, check_name
    from pyspark_rmqs.runs.watermarks import watermarks_after

    assert watermarks_after({"o-0": (10, 100), "o-1": (5, 5), "o-2": (0, 1)}) == {"o-0": 99, "o-2": 0}
    assert check_name("x" * MAX_NAME_BYTES) == "x" * MAX_NAME_BYTES
    with pytest.raises(ConfigurationError) as e:
        check_name("x" * (MAX_NAME_BYTES + 1))
    assert f"is {MAX_NAME_BYTES + 1} bytes; the broker allows at most {MAX_NAME_BYTES}" in str(e.value)


def test_watermarks_of_a_super_stream_and_a_stream(tracking: type[_Tracking]) -> None:
    from pyspark_rmqs.core.errors import StreamNotFoundError
    from pyspark_rmqs.runs.watermarks import watermarks

    tracking.stored[("etl", "o-1")] = 49
    w = watermarks(_CONN, "etl", superstream="o")
    assert (w.target, w.consumer, w.superstream) == ("o", "etl", True)
    assert [(p.stream, p.first, p.tail, p.stored) for p in w.partitions] == [
        ("o-0", 10, 100, None),
        ("o-1", 20, 200, 49),
    ]
    single = watermarks(_CONN, "etl", stream="single")
    assert (single.target, single.superstream, len(single.partitions)) == ("single", False, 1)
    with pytest.raises(StreamNotFoundError, match="stream 'nope' does not exist"):
        watermarks(_CONN, "etl", stream="nope")
    for kwargs in ({}, {"stream": "single", "superstream": "o"}):
        with pytest.raises(ConfigurationError, match="exactly one of 'stream' or 'superstream'"):
            watermarks(_CONN, "etl", **kwargs)


def test_store_watermarks_checked(tracking: type[_Tracking]) -> None:
    from pyspark_rmqs.core.errors import WatermarkConflictError
    from pyspark_rmqs.runs.watermarks import store_watermarks_checked

    tracking.stored[("etl", "o-0")] = 9
    store_watermarks_checked(_CONN, "etl", {"o-0": 99}, {"o-0": 9, "o-1": None})
    assert tracking.stores == [("etl", {"o-0": 99})]
    with pytest.raises(WatermarkConflictError) as e:
        store_watermarks_checked(_CONN, "etl", {"o-0": 150}, {"o-0": 9})
    assert str(e.value).startswith(
        "the watermark of consumer 'etl' was moved by another run since this run planned: 'o-0': 9 -> 99. "
        "Nothing was stored by this run"
    )
    assert len(tracking.stores) == 1, "nothing stored after a conflict"
    tracking.after_store[("etl", "o-0")] = 120  # a concurrent run overwrites right after this store
    with pytest.raises(
        WatermarkConflictError, match=r"while this run stored \(expected, found\): 'o-0': 150 -> 120"
    ):
        store_watermarks_checked(_CONN, "etl", {"o-0": 150}, {"o-0": 99})


def test_watermark_edges(tracking: type[_Tracking]) -> None:
    from pyspark_rmqs.core.errors import WatermarkConflictError
    from pyspark_rmqs.runs.watermarks import (
        PartitionWatermark,
        Watermarks,
        store_watermarks,
        store_watermarks_checked,
        watermarks,
    )

    one = Watermarks("o", "etl", True, (PartitionWatermark("o-0", 0, 1, None),))
    assert one.pending() == {"o-0": (0, 1)}, "a lag of one message is pending"
    store_watermarks(_CONN, "etl", {"o-0": 0})  # only offset 0 was read: 0 is a watermark too
    store_watermarks_checked(_CONN, "etl", {"o-1": 0}, {"o-1": None})
    assert tracking.stores == [("etl", {"o-0": 0}), ("etl", {"o-1": 0})]
    with pytest.raises(WatermarkConflictError) as e:
        store_watermarks_checked(_CONN, "etl", {"o-1": 9, "o-0": 9}, {"o-0": None, "o-1": None})
    assert "since this run planned: 'o-0': None -> 0, 'o-1': None -> 0. Nothing" in str(e.value)
    assert str(e.value).endswith(
        "Run one pipeline per consumer name at a time (the operators and assets serialise runs by "
        "default), or give each its own consumer name"
    )
    assert store_watermarks(_CONN, "etl", {"o-0": 0, "o-1": 5}) == {}
    assert store_watermarks(_CONN, "etl", {"o-1": 2}) == {"o-1": 5}, "never backwards"
    assert tracking.stored[("etl", "o-1")] == 5
    assert store_watermarks(_CONN, "etl", {"o-1": 2}, allow_backwards=True) == {}
    assert tracking.stored[("etl", "o-1")] == 2
    with pytest.raises(ConfigurationError, match=r"^give exactly one of 'stream' or 'superstream'$"):
        watermarks(_CONN, "etl")
