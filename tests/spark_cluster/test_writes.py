"""Writes from the standalone cluster's executors into a stream, with `producerName`: every row once
in the stream (each body at one offset, offsets 0..n-1), from a batch job and a streaming query."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.conftest import StreamFactory
from tests.spark_cluster.checks import assert_written_once
from tests.support.broker import BrokerSettings
from tests.support.data import publish, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_batch_write_with_a_producer_name(
    cluster_spark: SparkSession, broker: BrokerSettings, streams: StreamFactory
) -> None:
    target = streams.stream("cw")
    df = cluster_spark.range(0, 3000, 1, 4).selectExpr("format_string('b%06d', id) as value")
    df.write.format("rabbitmq_streams").options(
        **spark_options(broker, stream=target, producerName="loader")
    ).mode("append").save()
    assert_written_once(broker, target, [f"b{i:06d}".encode() for i in range(3000)])


def test_streaming_write_with_a_producer_name(
    cluster_spark: SparkSession, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    source, target = streams.stream("cso"), streams.stream("cst")
    bodies = [f"s{i:06d}".encode() for i in range(2500)]
    publish(broker, source, bodies)
    q = (
        cluster_spark.readStream.format("rabbitmq_streams")
        .options(**spark_options(broker, stream=source, maxRecordsPerTrigger="1000", metadataFields=""))
        .load()
        .select("value")
        .writeStream.format("rabbitmq_streams")
        .options(**spark_options(broker, stream=target, producerName="replayer"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(600), "the streaming write did not finish"
    assert q.exception() is None, q.exception()
    assert_written_once(broker, target, bodies)
