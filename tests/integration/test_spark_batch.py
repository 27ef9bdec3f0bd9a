"""Batch reads through spark.read.format("rabbitmq_streams") against the real broker."""

from __future__ import annotations

import json
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

from pyspark_rmqs.options import parse_source_options
from pyspark_rmqs.spark.batch import RabbitMQStreamsBatchReader, RabbitMQStreamsFilteringBatchReader
from tests.support.broker import BrokerSettings
from tests.support.data import publish, publish_keyed, settled_bounds, spark_options

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def read(spark: SparkSession, b: BrokerSettings, **opts: str):  # type: ignore[no-untyped-def]
    return spark.read.format("rabbitmq_streams").options(**spark_options(b, **opts)).load()


def rows(df) -> list[tuple[str, int, bytes]]:  # type: ignore[no-untyped-def]
    return sorted(
        (r.stream, r.offset, bytes(r.value)) for r in df.select("stream", "offset", "value").collect()
    )


def test_stream_exact_rows_and_offsets(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    bodies = [f"order-{i}".encode() for i in range(3000)]
    publish(broker, s, bodies)
    df = read(spark, broker, stream=s, metadataFields="")
    assert df.columns == ["value", "stream", "offset", "chunk_timestamp"]
    assert rows(df) == [(s, i, bodies[i]) for i in range(3000)]


def test_empty_stream_plans_no_partition(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    reader = RabbitMQStreamsBatchReader(
        parse_source_options(spark_options(broker, stream=s), streaming=False)
    )
    assert reader.plan() == []
    assert read(spark, broker, stream=s).count() == 0


def test_super_stream_exact_rows(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    items = [(f"k{i}", f"v{i}".encode()) for i in range(900)]
    publish_keyed(broker, name, items)
    got = rows(read(spark, broker, superstream=name, metadataFields=""))
    assert len(got) == 900
    assert sorted(v for _, _, v in got) == sorted(v for _, v in items)
    for p in parts:
        offs = [o for s, o, _ in got if s == p]
        assert offs == list(range(len(offs)))  # contiguous from 0 in every partition
    assert {s for s, _, _ in got} == set(parts)


def test_min_partitions_reads_the_same_rows(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [f"m{i}".encode() for i in range(2000)])
    whole = read(spark, broker, stream=s, metadataFields="")
    split = read(spark, broker, stream=s, metadataFields="", minPartitions="5")
    assert split.rdd.getNumPartitions() == 5
    assert rows(split) == rows(whole)


def test_starting_and_ending_offsets(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [f"m{i}".encode() for i in range(500)])
    got = rows(
        read(
            spark,
            broker,
            stream=s,
            startingOffsets="offset",
            startingOffset="100",
            endingOffsets="offset",
            endingOffset="250",
        )
    )
    assert [o for _, o, _ in got] == list(range(100, 250))
    got = rows(
        read(spark, broker, stream=s, startingOffsets=json.dumps({s: 490}), endingOffsets=json.dumps({s: -1}))
    )
    assert [o for _, o, _ in got] == list(range(490, 500))
    assert read(spark, broker, stream=s, startingOffsets="latest").count() == 0


def test_timestamp_start(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"old"] * 100)
    time.sleep(1.2)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    publish(broker, s, [b"new"] * 50)
    got = rows(read(spark, broker, stream=s, startingOffsets="timestamp", startingTimestamp=str(cut)))
    assert [o for _, o, _ in got] == list(range(100, 150))
    assert {v for _, _, v in got} == {b"new"}


def test_filter_pushdown_same_rows_reads_less(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(3)
    publish_keyed(broker, name, [(f"k{i}", f"v{i}".encode()) for i in range(1500)])
    target = parts[1]
    where = f"stream = '{target}' AND offset >= 10 AND offset < 40"
    pushed = read(spark, broker, superstream=name, metadataFields="").where(where)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        plain = read(spark, broker, superstream=name, metadataFields="").where(where)
        expected = rows(plain)
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    assert rows(pushed) == expected
    assert [o for _, o, _ in expected] == list(range(10, 40))
    # and it plans only the matching range of the matching partition
    reader = RabbitMQStreamsFilteringBatchReader(
        parse_source_options(spark_options(broker, superstream=name), streaming=False)
    )
    left = list(
        reader.pushFilters(
            [EqualTo(("stream",), target), GreaterThanOrEqual(("offset",), 10), LessThan(("offset",), 40)]
        )
    )
    assert left == []
    assert [(r.stream, r.start, r.end) for r in reader.plan()] == [(target, 10, 40)]


def test_fail_on_data_loss_for_retention(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream(arguments={"max-length-bytes": 20_000, "stream-max-segment-size-bytes": 5_000})
    for _ in range(10):
        publish(broker, s, [b"x" * 200] * 40)
    first, tail = settled_bounds(broker, s, truncated=True)
    assert first > 0, "retention should have truncated the stream"
    with pytest.raises(PySparkException, match=r"DataLossError: offsets \[\d+, \d+\) of stream .* are lost"):
        read(spark, broker, stream=s, startingOffsets="offset", startingOffset="0").count()
    got = rows(
        read(spark, broker, stream=s, startingOffsets="offset", startingOffset="0", failOnDataLoss="false")
    )
    offs = [o for _, o, _ in got]
    # retention may advance once more between our look and Spark's planning: never below `first`
    assert offs[0] >= first and offs == list(range(offs[0], tail))


def test_unknown_option_fails_with_suggestion(spark: SparkSession, broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    with pytest.raises(PySparkException, match="did you mean 'startingOffsets'"):
        read(spark, broker, stream=s, startingOffsetz="latest").count()


def test_missing_stream_is_a_clear_error(spark: SparkSession, broker: BrokerSettings) -> None:
    with pytest.raises(PySparkException, match="stream 'no-such-stream-xyz' does not exist"):
        read(spark, broker, stream="no-such-stream-xyz").count()
