"""Reads on the standalone cluster: a batch read of a super stream and an AvailableNow drain with a
checkpoint, each task in an executor JVM of its own, every (stream, offset) counted."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.conftest import StreamFactory
from tests.e2e.faults.support import assert_exact
from tests.spark_cluster.checks import assert_each_offset_once, message_offsets, output_pairs, task_attempts
from tests.spark_cluster.conftest import ClusterSession
from tests.support.broker import BrokerSettings
from tests.support.data import publish, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_batch_read_of_a_super_stream_on_two_executors(
    cluster_spark: SparkSession,
    cluster_session: ClusterSession,
    broker: BrokerSettings,
    streams: StreamFactory,
) -> None:
    name, parts = streams.super_stream(3)
    expected = {p: [f"{p}:{i}".encode() for i in range(1000 + 100 * k)] for k, p in enumerate(parts)}
    for p, bodies in expected.items():
        publish(broker, p, bodies)
    df = (
        cluster_spark.read.format("rabbitmq_streams")
        .options(**spark_options(broker, superstream=name))
        .load()
    )
    rows = [(r.stream, r.offset, bytes(r.value)) for r in df.select("stream", "offset", "value").collect()]
    assert_exact(rows, expected)  # every (stream, offset) once, in 0..n-1, bodies equal
    # The partitions were read by executors (not the driver): one task per partition stream.
    reads = [t for t in task_attempts(cluster_session.ui) if t["status"] == "SUCCESS"]
    assert {t["executorId"] for t in reads} - {"driver"}, reads


def test_available_now_drain_with_a_checkpoint_twice(
    cluster_spark: SparkSession, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    name, parts = streams.super_stream(3)
    for p in parts:
        publish(broker, p, [f"{p}:a{i}".encode() for i in range(700)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def drain() -> None:
        q = (
            cluster_spark.readStream.format("rabbitmq_streams")
            .options(**spark_options(broker, superstream=name, maxRecordsPerTrigger="900"))
            .load()
            .select("stream", "offset", "value")
            .writeStream.format("parquet")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start(str(out))
        )
        assert q.awaitTermination(600), "the AvailableNow query did not finish"
        assert q.exception() is None, q.exception()

    drain()
    assert_each_offset_once(output_pairs(out), message_offsets(broker, parts))
    for k, p in enumerate(parts):  # new data; the second drain resumes from the checkpoint
        publish(broker, p, [f"{p}:b{i}".encode() for i in range(50 * (k + 1))])
    drain()
    assert_each_offset_once(output_pairs(out), message_offsets(broker, parts))
