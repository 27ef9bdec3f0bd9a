"""The sensors' decisions from watermarks and cursors (pure functions: no broker)."""

import json

import pytest
from dagster import AssetKey, build_sensor_context

from dagster_rmqs import offset_range_key, offset_range_partitions
from dagster_rmqs.sensors import evaluate_new_data, evaluate_observation, tails_data_version
from pyspark_rmqs.runs.watermarks import PartitionWatermark, Watermarks

PDEF = offset_range_partitions("orders_ranges")


def marks(tails: dict[str, int], stored: int | None = None) -> Watermarks:
    parts = tuple(PartitionWatermark(s, 0, t, stored) for s, t in tails.items())
    return Watermarks("orders", "c", len(tails) > 1, parts)


def test_offset_ranges_are_added_at_most_once_per_interval_unless_big() -> None:
    first = evaluate_new_data(marks({"o-0": 10, "o-1": 5}), None, 1, PDEF, min_range_interval_s=600, now=1000)
    keys = [r.partition_key for r in first.run_requests or []]
    assert keys == [offset_range_key("o-0", 0, 10), offset_range_key("o-1", 0, 5)]
    assert json.loads(first.cursor or "") == {"tails": {"o-0": 10, "o-1": 5}, "added_at": 1000}

    # Ticks within the interval: no new key, however many ticks, until the range is big enough.
    for now in (1030, 1300, 1599):
        quiet = evaluate_new_data(
            marks({"o-0": 40, "o-1": 5}),
            first.cursor,
            1,
            PDEF,
            min_range_interval_s=600,
            max_range_messages=100,
            now=now,
        )
        assert not quiet.run_requests and "min_range_interval_s" in str(quiet.skip_reason)
    due = evaluate_new_data(
        marks({"o-0": 40, "o-1": 5}), first.cursor, 1, PDEF, min_range_interval_s=600, now=1600
    )
    assert [r.partition_key for r in due.run_requests or []] == [offset_range_key("o-0", 10, 40)]
    big = evaluate_new_data(
        marks({"o-0": 150, "o-1": 5}),
        first.cursor,
        1,
        PDEF,
        min_range_interval_s=600,
        max_range_messages=100,
        now=1010,
    )
    assert [r.partition_key for r in big.run_requests or []] == [offset_range_key("o-0", 10, 150)]
    # A day of ticks every 30 s with steady traffic adds 24 keys per partition stream (hourly).
    cursor, added = None, 0
    for i in range(0, 86_400, 30):
        r = evaluate_new_data(marks({"o-0": i + 1}), cursor, 1, PDEF, now=float(i))
        if r.run_requests:
            added += len(r.run_requests)
            cursor = r.cursor
    assert added == 24
    # A cursor of the former flat format still continues from its tails.
    legacy = evaluate_new_data(marks({"o-0": 12}), json.dumps({"o-0": 10}), 1, PDEF, now=5)
    assert [r.partition_key for r in legacy.run_requests or []] == [offset_range_key("o-0", 10, 12)]


def test_offsets_retention_removed_after_the_cursor_are_in_the_next_key_not_skipped() -> None:
    """The next key starts at the cursor (or after the watermark), not at the first offset kept: its
    run then reports the removed offsets as data loss instead of no key ever naming them."""
    truncated = Watermarks("orders", "c", False, (PartitionWatermark("o-0", 50, 80, None),))
    r = evaluate_new_data(truncated, json.dumps({"tails": {"o-0": 30}, "added_at": 0}), 1, PDEF, now=10_000)
    assert [q.partition_key for q in r.run_requests or []] == [offset_range_key("o-0", 30, 80)]
    behind = Watermarks("orders", "c", False, (PartitionWatermark("o-0", 50, 80, 19),))
    r = evaluate_new_data(behind, None, 1, PDEF, now=10_000)
    assert [q.partition_key for q in r.run_requests or []] == [offset_range_key("o-0", 20, 80)]


def test_observations_carry_a_tails_data_version_and_only_when_tails_change() -> None:
    key = AssetKey("orders_stream")
    one = evaluate_observation(key, marks({"o-0": 8}, stored=2), None)
    (obs,) = one.asset_events
    version = tails_data_version({"o-0": 8})
    assert obs.tags["dagster/data_version"] == version and obs.metadata["total_lag"].value == 5
    same = evaluate_observation(key, marks({"o-0": 8}, stored=7), one.cursor)
    assert not same.asset_events and "not changed" in str(same.skip_reason)
    moved = evaluate_observation(key, marks({"o-0": 9}, stored=7), one.cursor)
    (obs2,) = moved.asset_events
    assert obs2.tags["dagster/data_version"] != version
    assert build_sensor_context(cursor=moved.cursor).cursor == json.dumps({"o-0": 9})


def test_stream_target_is_built_on_the_core_target() -> None:
    """`StreamTarget` keeps its fields and metadata keys; the check and the name are the core `Target`'s."""
    from dagster_rmqs import StreamTarget
    from dagster_rmqs.targets import make_target
    from pyspark_rmqs.core.errors import ConfigurationError
    from pyspark_rmqs.core.target import Target

    t = make_target(None, "orders", "etl")
    assert (t.stream, t.superstream, t.consumer_name, t.rabbitmq_key) == (None, "orders", "etl", "rabbitmq")
    assert t.target == Target("orders", True) and t.name == "orders"
    assert t.metadata() == {
        "rmqs/superstream": "orders",
        "rmqs/consumer_name": "etl",
        "rmqs/resource_key": "rabbitmq",
    }
    assert StreamTarget("s", None, None, "east").metadata() == {
        "rmqs/stream": "s",
        "rmqs/resource_key": "east",
    }
    assert t == StreamTarget(None, "orders", "etl")  # equality is the fields'
    for stream, superstream in ((None, None), ("s", "orders")):
        with pytest.raises(ConfigurationError, match=r"^give exactly one of 'stream' or 'superstream'$"):
            StreamTarget(stream, superstream, "etl")
    with pytest.raises(ConfigurationError, match="rabbitmq_key must be a Python identifier"):
        make_target("s", None, "etl", "not-an-identifier")
