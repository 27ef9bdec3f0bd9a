"""The watermark protocol shared by Airflow and Dagster: plan, read into a sink, then store."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.jobs import plan_read, run_drain, run_read, write_output
from pyspark_rmqs.runs.watermarks import watermarks
from tests.support.broker import BrokerSettings
from tests.support.data import conn_of, publish

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def parquet_values(spark: SparkSession, path: Path) -> list[bytes]:
    return sorted(bytes(r.value) for r in spark.read.parquet(str(path)).collect())


def test_watermark_moves_only_after_the_sink(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    conn = conn_of(broker)
    publish(broker, s, [f"a{i}".encode() for i in range(120)])
    plan = plan_read(conn, stream=s, consumer="job")
    assert plan.ranges == {s: (0, 120)}

    def failing_sink(df: DataFrame) -> None:
        df.write.parquet(str(tmp_path / "never"))
        raise RuntimeError("sink commit failed")

    with pytest.raises(RuntimeError, match="sink commit failed"):
        run_read(spark, conn, plan, failing_sink)
    assert watermarks(conn, "job", stream=s).partitions[0].stored is None  # unchanged

    retry = plan_read(conn, stream=s, consumer="job")
    assert retry.ranges == plan.ranges  # the retry reads the same range
    out = tmp_path / "out"
    summary = run_read(spark, conn, retry, write_output(str(out)))
    expected_bytes = sum(len(f"a{i}") for i in range(120))
    assert (summary.rows, summary.bytes, summary.lag_after, summary.watermark_stored) == (
        120,
        expected_bytes,
        0,
        True,
    )
    assert parquet_values(spark, out) == sorted(f"a{i}".encode() for i in range(120))
    assert watermarks(conn, "job", stream=s).partitions[0].stored == 119

    again = plan_read(conn, stream=s, consumer="job")
    assert again.is_empty
    assert run_read(spark, conn, again, write_output(str(out))).rows == 0


def test_max_messages_and_explicit_ranges(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(2)
    conn = conn_of(broker)
    publish(broker, parts[0], [b"x"] * 300)
    publish(broker, parts[1], [b"y"] * 100)
    plan = plan_read(conn, superstream=name, consumer="c", max_messages=100)
    assert plan.ranges == {parts[0]: (0, 75), parts[1]: (0, 25)}
    plan = plan_read(conn, superstream=name, start={parts[0]: 10}, end={parts[0]: 20, parts[1]: 0})
    assert plan.ranges == {parts[0]: (10, 20)}
    with pytest.raises(ConfigurationError, match="consumer_name"):
        plan_read(conn, superstream=name, start="watermark")


def test_available_now_drain_stores_the_final_watermark(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    s = streams.stream()
    conn = conn_of(broker)
    publish(broker, s, [f"d{i}".encode() for i in range(250)])
    summary = run_drain(
        spark,
        conn,
        stream=s,
        consumer="drain",
        checkpoint=str(tmp_path / "ck"),
        output_path=str(tmp_path / "o"),
        source_options={"maxRecordsPerTrigger": "100", "metadataFields": ""},
    )
    assert (summary.rows, summary.start_offsets, summary.end_offsets) == (250, {s: 0}, {s: 250})
    assert summary.lag_after == 0
    assert watermarks(conn, "drain", stream=s).partitions[0].stored == 249
    assert parquet_values(spark, tmp_path / "o") == sorted(f"d{i}".encode() for i in range(250))


def test_exactly_once_files_into_an_object_store_uri_are_refused_before_anything_is_written(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Spark's exactly-once files are published by one folder rename, which object stores lack:
    `run_read` into an `s3a://` (or any non-file) URI fails with `ConfigurationError` naming what to
    use instead, before its sink writes anything; the watermark stays, and the retry of the run into
    a local folder reads the same range, every offset once."""
    s = streams.stream()
    conn = conn_of(broker)
    publish(broker, s, [f"o{i}".encode() for i in range(50)])
    plan = plan_read(conn, stream=s, consumer="objstore")
    with pytest.raises(ConfigurationError, match="needs a local or mounted file system") as refused:
        run_read(spark, conn, plan, write_output("s3a://bucket/out"))
    assert "Spark-free consume" in str(refused.value) and "at_least_once" in str(refused.value)
    assert watermarks(conn, "objstore", stream=s).partitions[0].stored is None
    retry = plan_read(conn, stream=s, consumer="objstore")
    assert retry.resumed and retry.ranges == plan.ranges
    run_read(spark, conn, retry, write_output(str(tmp_path / "out")))
    assert parquet_values(spark, tmp_path / "out") == sorted(f"o{i}".encode() for i in range(50))
