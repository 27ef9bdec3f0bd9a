"""`producerName` never drops new data: later batch jobs and new streaming checkpoints under the same
name keep every row. (Re-sent rows being dropped is tested under real failures in
tests/e2e/faults/test_write_dedup.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.options import parse_sink_options
from pyspark_rmqs.spark.sink import check_producer_name
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish, spark_options

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _stored(b: BrokerSettings, stream: str) -> list[bytes]:
    return list(read_range(conn_of(b), stream, 0, client(b).tail(stream)).column("value").to_pylist())


def _numbered(spark: SparkSession, prefix: str, n: int, partitions: int) -> DataFrame:
    return spark.range(0, n, 1, partitions).selectExpr(f"format_string('{prefix}%06d', id) as value")


def test_three_batch_jobs_with_one_producer_name_keep_every_row(
    spark: SparkSession, broker: BrokerSettings, streams
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("dd")
    expected: list[bytes] = []
    for run in ("a", "b", "c"):
        _numbered(spark, run, 1000, 2).write.format("rabbitmq_streams").options(
            **spark_options(broker, stream=s, producerName="loader")
        ).mode("append").save()
        expected += [f"{run}{i:06d}".encode() for i in range(1000)]
    got = _stored(broker, s)
    assert len(got) == 3000, f"{len(got)} of 3,000 rows in the stream"
    assert sorted(got) == sorted(expected)


def test_the_same_rows_written_by_two_jobs_are_both_kept(
    spark: SparkSession, broker: BrokerSettings, streams
) -> None:  # type: ignore[no-untyped-def]
    """A second job is new data as far as the sink knows (an Airflow retry re-publishes: at least once)."""
    s = streams.stream("dd")
    df = _numbered(spark, "x", 500, 2)
    for _ in range(2):
        df.write.format("rabbitmq_streams").options(
            **spark_options(broker, stream=s, producerName="loader")
        ).mode("append").save()
    got = _stored(broker, s)
    assert sorted(got) == sorted([f"x{i:06d}".encode() for i in range(500)] * 2)


def test_a_new_checkpoint_with_the_same_producer_name_keeps_its_rows(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    source, target = streams.stream("dso"), streams.stream("dta")
    bodies = [f"n{i:06d}".encode() for i in range(1500)]
    publish(broker, source, bodies)
    for ckpt in ("first", "second"):  # each a new query (new query id), epochs numbered from 0 again
        q = (
            spark.readStream.format("rabbitmq_streams")
            .options(**spark_options(broker, stream=source, maxRecordsPerTrigger="500", metadataFields=""))
            .load()
            .select("value")
            .writeStream.format("rabbitmq_streams")
            .options(**spark_options(broker, stream=target, producerName="replayed"))
            .option("checkpointLocation", str(tmp_path / ckpt))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(180)
        assert q.exception() is None
    got = _stored(broker, target)
    assert len(got) == 3000, f"{len(got)} of 3,000 rows: the second checkpoint's rows were dropped"
    assert sorted(got) == sorted(bodies * 2)


def test_sub_entry_batching_with_a_producer_name_warns(
    broker: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    import pyspark_rmqs.spark.sink as sink

    sink._warned_sub_entry = False
    opts = parse_sink_options(
        spark_options(broker, stream="s", producerName="p", subEntrySize="10", compression="zstd")
    )
    with caplog.at_level(logging.WARNING, logger="pyspark_rmqs.spark.sink"):
        check_producer_name(opts)
    assert "deduplication of re-sent messages is not guaranteed" in caplog.text
