"""Time-window partitions: a window reads the messages whose chunk timestamp falls in it.

Windows are one minute (a cron, the finest Dagster offers): the test publishes into one minute,
waits for the next, publishes again, and counts every offset: each in exactly one window.
"""

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, ExecuteInProcessResult, TimeWindowPartitionsDefinition, materialize
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from pyspark.sql import SparkSession

from dagster_rmqs import RabbitMQStreamsResource, build_new_data_sensor, build_stream_asset
from pyspark_rmqs.errors import ConfigurationError
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = [pytest.mark.dagster, pytest.mark.slow]
FMT = "%Y-%m-%d-%H:%M"


def meta(result: ExecuteInProcessResult, name: str) -> list[dict[str, Any]]:
    return [{k: v.value for k, v in m.metadata.items()} for m in result.asset_materializations_for_node(name)]


def rows(spark: SparkSession, path: Path) -> list[tuple[int, datetime]]:
    df = spark.read.parquet(str(path)).select("offset", "chunk_timestamp")
    return sorted((int(r.offset), r.chunk_timestamp.replace(tzinfo=UTC)) for r in df.collect())


def minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def test_adjacent_windows_split_the_stream_exactly_and_a_backfill_reads_both_in_one_run(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    s = streams.stream()
    now = datetime.now(UTC)
    if now.second >= 45:  # leave the first minute room for its two flushes
        time.sleep(61 - now.second)
    first = minute(datetime.now(UTC))
    publish(broker, s, [f"a{i}".encode() for i in range(30)])
    time.sleep(0.2)
    publish(broker, s, [f"b{i}".encode() for i in range(20)])  # a second chunk, a later timestamp
    second = first + timedelta(minutes=1)
    time.sleep(max(0.0, (second - datetime.now(UTC)).total_seconds()) + 0.5)
    publish(broker, s, [f"c{i}".encode() for i in range(25)])  # the next (still open) minute
    pdef = TimeWindowPartitionsDefinition(  # end_offset=1: the current (open) window is a partition too
        cron_schedule="* * * * *", fmt=FMT, start=first - timedelta(minutes=5), timezone="UTC", end_offset=1
    )
    k1, k2 = first.strftime(FMT), second.strftime(FMT)

    def asset_into(out: Path) -> Any:
        return build_stream_asset(
            "windows", stream=s, consumer_name="dgw", output_path=str(out), partitions_def=pdef
        )

    resources = {"rabbitmq": rabbitmq, "spark": spark}
    instance = DagsterInstance.ephemeral()
    (open_meta,) = meta(
        materialize([asset_into(tmp_path / "w2")], instance=instance, resources=resources, partition_key=k2),
        "windows",
    )
    (closed_meta,) = meta(
        materialize([asset_into(tmp_path / "w1")], instance=instance, resources=resources, partition_key=k1),
        "windows",
    )

    assert open_meta["window_open"] is True and closed_meta["window_open"] is False
    assert (closed_meta["start_offsets"], closed_meta["end_offsets"]) == ({s: 0}, {s: 50})
    assert (open_meta["start_offsets"], open_meta["end_offsets"]) == ({s: 50}, {s: 75})
    assert (closed_meta["dagster/row_count"], open_meta["dagster/row_count"]) == (50, 25)
    w1, w2 = rows(spark, tmp_path / "w1"), rows(spark, tmp_path / "w2")
    assert all(first <= ts < second for _, ts in w1)  # chunk timestamps inside their windows
    assert all(second <= ts for _, ts in w2)
    offsets = [o for o, _ in w1] + [o for o, _ in w2]
    assert sorted(offsets) == list(range(75))  # every offset in exactly one window
    assert rabbitmq.stored_offsets("dgw", stream=s) == {s: None}  # windows never move the watermark

    # A backfill of both windows: one run (single-run policy), one read of the whole span.
    tags = {ASSET_PARTITION_RANGE_START_TAG: k1, ASSET_PARTITION_RANGE_END_TAG: k2}
    backfill = materialize([asset_into(tmp_path / "both")], instance=instance, resources=resources, tags=tags)
    mats = meta(backfill, "windows")
    assert len(mats) == 2 and all(m["partition_keys"] == [k1, k2] for m in mats)
    assert (mats[0]["start_offsets"], mats[0]["end_offsets"], mats[0]["dagster/row_count"]) == (
        {s: 0},
        {s: 75},
        75,
    )
    assert [o for o, _ in rows(spark, tmp_path / "both")] == list(range(75))
    assert rabbitmq.stored_offsets("dgw", stream=s) == {s: None}


def test_time_window_assets_refuse_a_new_data_sensor_and_max_messages() -> None:
    daily = TimeWindowPartitionsDefinition(cron_schedule="0 0 * * *", fmt="%Y-%m-%d", start="2026-01-01")
    asset = build_stream_asset("d", stream="s", consumer_name="c", output_path="/tmp/x", partitions_def=daily)
    assert asset.partitions_def == daily and asset.backfill_policy is not None
    with pytest.raises(ConfigurationError, match="automation_condition"):
        build_new_data_sensor(asset)
    with pytest.raises(ConfigurationError, match="max_messages"):
        build_stream_asset(
            "d", stream="s", consumer_name="c", output_path="/x", partitions_def=daily, max_messages=5
        )
