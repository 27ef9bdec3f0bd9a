"""Planning at the edges, against the real broker, counting every offset.

Two cases a plan used to get wrong:
- a start by timestamp on a stream whose retention removed messages at or after that time: the read
  began at the first offset left, silently (a read of the same range by offsets reported it);
- a super stream partition added after `jobs.plan_read` planned: the Spark read resolved the
  partitions again and read the new one outside the plan, and the next run read it once more.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from pyspark_rmqs import jobs
from pyspark_rmqs.core.errors import DataLossError
from pyspark_rmqs.options import parse_source_options
from pyspark_rmqs.runs.consume import run_consume
from pyspark_rmqs.runs.watermarks import watermarks
from pyspark_rmqs.spark.streaming import RabbitMQStreamsStreamReader
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish, settled_bounds, spark_options

pytestmark = [pytest.mark.broker]

# ~210-byte messages, 40 per chunk (one publish = one chunk of ~8.5 KB, a segment of its own): about
# two chunks are kept, so ten chunks leave offsets [first, 400) with first > 0.
RETENTION = {"max-length-bytes": 20_000, "stream-max-segment-size-bytes": 5_000}
ROUNDS, PER_ROUND = 10, 40


def _offsets_of(batches: list[Any]) -> list[tuple[str, int]]:
    return [
        (s, o)
        for b in batches
        for s, o in zip(b.column("stream").to_pylist(), b.column("offset").to_pylist(), strict=True)
    ]


# ------------------------------------------------------------------ timestamps and retention


@pytest.fixture
def truncated(broker: BrokerSettings, streams: StreamFactory) -> tuple[str, datetime, datetime, int, int]:
    """A stream retention truncated: (name, a time before every message, a time after the ninth chunk
    while that chunk is still kept, first offset, tail)."""
    s = streams.stream("ts-ret", arguments=dict(RETENTION))
    before = datetime.now(UTC) - timedelta(seconds=2)
    for r in range(ROUNDS - 1):
        publish(broker, s, [b"%03d" % r + b"x" * 200] * PER_ROUND)
    time.sleep(0.2)
    after_ninth = datetime.now(UTC)
    time.sleep(0.2)
    publish(broker, s, [b"last"] * 5)  # a small tenth chunk: the ninth stays within the retention
    first, tail = settled_bounds(broker, s, truncated=True)
    assert tail == (ROUNDS - 1) * PER_ROUND + 5
    assert 0 < first <= (ROUNDS - 2) * PER_ROUND, (
        "retention should have removed a prefix, keeping the ninth chunk"
    )
    return s, before, after_ninth, first, tail


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _assert_names_the_loss(text: str, stream: str, first: int, at: datetime) -> None:
    assert f"stream '{stream}'" in text, text
    assert re.search(rf"offsets \[0, {first}\)", text), text  # the offsets retention removed
    assert str(_ms(at)) in text, text  # the requested time
    assert "oldest chunk kept" in text, text  # and the broker's time of what is left
    assert "failOnDataLoss" in text, text


def test_a_timestamp_start_before_what_retention_removed_is_data_loss_in_jobs(
    broker: BrokerSettings, truncated: tuple[str, datetime, datetime, int, int]
) -> None:
    s, before, _, first, tail = truncated
    conn = conn_of(broker)
    # The same read by offsets reports the loss: by time, it must too.
    with pytest.raises(DataLossError, match=rf"offsets \[0, {first}\) of stream '{s}' are lost"):
        jobs.plan_read(conn, stream=s, start={s: 0}, end="latest")
    for start in (before, _ms(before)):  # a datetime (Dagster windows) or epoch ms (Airflow)
        with pytest.raises(DataLossError) as lost:
            jobs.plan_read(conn, stream=s, start=start, end="latest")
        _assert_names_the_loss(str(lost.value), s, first, before)
    plan = jobs.plan_read(conn, stream=s, start=before, end="latest", fail_on_data_loss=False)
    assert plan.ranges == {s: (first, tail)}
    batches: list[Any] = []
    summary = run_consume(conn, plan, batches.append)
    assert _offsets_of(batches) == [(s, o) for o in range(first, tail)]
    assert summary.rows == tail - first
    assert summary.extra["data_loss"] == {s: [0, first]}  # the run says it may have lost rows


@pytest.mark.dagster
@pytest.mark.parametrize("lenient", [False, True])
def test_a_dagster_time_window_starting_before_what_retention_removed_is_data_loss(
    broker: BrokerSettings, truncated: tuple[str, datetime, datetime, int, int], tmp_path: Any, lenient: bool
) -> None:
    """A time-window partition whose start is before the oldest chunk retention kept: the window's
    offsets are located by time, so what retention removed may have been in it. Before: the window
    read from the first offset kept, silently (windows resolved their times to offsets and planned
    by offsets, passing by the check a read from a time makes)."""
    from dagster import DagsterInstance, TimeWindowPartitionsDefinition, materialize

    from dagster_rmqs import RabbitMQStreamsResource, build_stream_asset

    s, before, _, first, tail = truncated
    start = before.replace(second=0, microsecond=0)
    windows = TimeWindowPartitionsDefinition(
        cron_schedule="* * * * *", start=start - timedelta(minutes=1), fmt="%Y-%m-%d-%H:%M", end_offset=1
    )
    asset = build_stream_asset(
        "windows_on_truncated",
        consumer_name="windows",
        stream=s,
        output_path=str(tmp_path / "out"),
        engine="arrow",
        partitions_def=windows,
        fail_on_data_loss=not lenient,
    )
    resource = RabbitMQStreamsResource(
        endpoints=f"{broker.host}:{broker.port}", username=broker.username, password=broker.password
    )
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [asset],
            resources={"rabbitmq": resource},
            instance=instance,
            partition_key=start.strftime("%Y-%m-%d-%H:%M"),
            raise_on_error=False,
        )
    if not lenient:
        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure)
        text = str(failure.step_failure_data.error)
        assert "DataLossError" in text and f"offsets [0, {first}) of stream '{s}' are lost" in text, text
        return
    assert result.success
    (m,) = result.asset_materializations_for_node("windows_on_truncated")
    metadata = {k: v.value for k, v in m.metadata.items()}
    assert metadata["data_loss"] == {s: [0, first]}  # the window says it may have lost rows
    assert metadata["start_offsets"] == {s: first} and metadata["dagster/row_count"] == tail - first


def test_a_timestamp_start_after_the_oldest_chunk_kept_is_no_data_loss(
    broker: BrokerSettings, truncated: tuple[str, datetime, datetime, int, int]
) -> None:
    s, _, after_ninth, _, tail = truncated
    conn = conn_of(broker)
    plan = jobs.plan_read(conn, stream=s, start=after_ninth, end="latest")
    assert plan.ranges == {s: (tail - 5, tail)}  # the tenth chunk only; what retention removed was older
    batches: list[Any] = []
    summary = run_consume(conn, plan, batches.append)
    assert _offsets_of(batches) == [(s, o) for o in range(tail - 5, tail)]
    assert summary.rows == 5


@pytest.mark.spark
def test_a_timestamp_start_before_what_retention_removed_is_data_loss_in_spark(
    spark: SparkSession, broker: BrokerSettings, truncated: tuple[str, datetime, datetime, int, int]
) -> None:
    s, before, after_ninth, first, tail = truncated
    opts = spark_options(
        broker, stream=s, startingOffsets="timestamp", startingTimestamp=str(_ms(before)), metadataFields=""
    )
    with pytest.raises(PySparkException) as failed:
        spark.read.format("rabbitmq_streams").options(**opts).load().count()
    assert "DataLossError" in str(failed.value)
    _assert_names_the_loss(str(failed.value), s, first, before)
    df = spark.read.format("rabbitmq_streams").options(**{**opts, "failOnDataLoss": "false"}).load()
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets == list(range(first, tail))
    opts["startingTimestamp"] = str(_ms(after_ninth))
    df = spark.read.format("rabbitmq_streams").options(**opts).load()
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(tail - 5, tail))
    # A Spark run of jobs names what it may have lost in its summary, read or not.
    conn, rows = conn_of(broker), []
    plan = jobs.plan_read(conn, stream=s, start=before, fail_on_data_loss=False)
    summary = jobs.run_read(spark, conn, plan, lambda df: rows.extend(df.select("offset").collect()))
    assert sorted(r.offset for r in rows) == list(range(plan.start[s], tail)) and plan.start[s] >= first
    assert summary.extra["data_loss"] == {s: [0, plan.start[s]]}
    window = jobs.plan_read(
        conn, stream=s, start=before, end=before + timedelta(seconds=1), fail_on_data_loss=False
    )
    assert window.is_empty  # the whole window is in what retention removed
    summary = jobs.run_read(spark, conn, window, lambda df: rows.append(df.count()))
    assert summary.rows == 0 and summary.extra["data_loss"] == {s: [0, window.start[s]]}


def test_a_timestamp_start_is_data_loss_for_the_streaming_initial_offsets(
    broker: BrokerSettings, truncated: tuple[str, datetime, datetime, int, int]
) -> None:
    s, before, _, first, _ = truncated

    def initial(**extra: str) -> dict[str, int]:
        opts = spark_options(
            broker, stream=s, startingOffsets="timestamp", startingTimestamp=str(_ms(before)), **extra
        )
        return RabbitMQStreamsStreamReader(parse_source_options(opts, streaming=True)).initialOffset()

    with pytest.raises(DataLossError) as lost:
        initial()
    _assert_names_the_loss(str(lost.value), s, first, before)
    assert initial(failOnDataLoss="false") == {s: first}
    # A stream resumed from the broker-stored offset of consumerName does not start at the timestamp.
    client(broker).store_offsets("resume", {s: first + 3})
    assert initial(consumerName="resume") == {s: first + 4}


# ------------------------------------------------------------------ a partition added after planning


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "arrow"])
def test_a_partition_added_after_planning_is_read_by_the_next_run_only(
    spark: SparkSession, broker: BrokerSettings, streams: StreamFactory, engine: str
) -> None:
    if broker.external:
        pytest.skip("binds a partition through the local broker's management API")
    name, parts = streams.super_stream(2)
    conn = conn_of(broker)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(100)])
    consumer = f"edges-{engine}"

    def run(plan: jobs.ReadPlan) -> list[tuple[str, int]]:
        if engine == "arrow":
            batches: list[Any] = []
            summary = run_consume(conn, plan, batches.append, metadata_fields="")
            got = _offsets_of(batches)
        else:
            rows: list[Any] = []

            def sink(df: DataFrame) -> None:
                rows.extend(df.select("stream", "offset").collect())

            summary = jobs.run_read(spark, conn, plan, sink, metadata_fields="")
            got = [(r.stream, r.offset) for r in rows]
        assert summary.rows == len(got) and summary.watermark_stored
        return got

    plan = jobs.plan_read(conn, superstream=name, consumer=consumer)
    assert plan.ranges == {parts[0]: (0, 100), parts[1]: (0, 100)}
    added = streams.add_partition(name, 2)
    assert client(broker).partitions(name) == [*parts, added]
    publish(broker, added, [f"{added}:{i}".encode() for i in range(50)])

    first_run = run(plan)
    assert sorted(first_run) == [(p, o) for p in parts for o in range(100)]  # the plan, nothing else
    stored = watermarks(conn, consumer, superstream=name).stored_offsets()
    assert stored == {parts[0]: 99, parts[1]: 99, added: None}

    plan = jobs.plan_read(conn, superstream=name, consumer=consumer)
    assert plan.ranges == {added: (0, 50)}  # no watermark yet: from starting_offsets (earliest)
    second_run = run(plan)
    assert sorted(second_run) == [(added, o) for o in range(50)]
    everything = first_run + second_run
    assert len(everything) == len(set(everything)) == 250  # every offset once: 250 rows for 250 offsets
    assert watermarks(conn, consumer, superstream=name).stored_offsets() == {p: 99 for p in parts} | {
        added: 49
    }


@pytest.mark.spark
def test_an_ending_offsets_json_names_the_partitions_a_batch_reads(
    spark: SparkSession, broker: BrokerSettings, streams: StreamFactory
) -> None:
    name, parts = streams.super_stream(3)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(30)])

    def offsets(**opts: str) -> list[tuple[str, int]]:
        df = (
            spark.read.format("rabbitmq_streams")
            .options(**spark_options(broker, superstream=name, **opts))
            .load()
        )
        return sorted((r.stream, r.offset) for r in df.select("stream", "offset").collect())

    # endingOffsets names two partitions: the third is not read (name it with -1 to read it to its tail)
    got = offsets(endingOffsets=f'{{"{parts[0]}": 10, "{parts[1]}": -1}}')
    assert got == [(parts[0], o) for o in range(10)] + [(parts[1], o) for o in range(30)]
    # a startingOffsets JSON does not: an unnamed partition starts at its first offset
    got = offsets(startingOffsets=f'{{"{parts[0]}": 25}}')
    assert got == [(parts[0], o) for o in range(25, 30)] + [(p, o) for p in parts[1:] for o in range(30)]


# ------------------------------------------------------------------ a broker rmqs never used


def test_the_first_watermark_run_on_a_broker_without_the_records_stream(broker: BrokerSettings) -> None:
    """A virtual host rmqs never used has no `rmqs.runs`: the first run's lease must create it, not
    fail with StreamDoesNotExist (it did: the lease subscribed to the records stream before the
    first record was written). Every offset is read once, and the next run reads nothing again."""
    import dataclasses
    import uuid

    from tests.support.broker import management

    if broker.external:
        pytest.skip("RMQS_TEST_URI is set: cannot create virtual hosts on that broker")
    vhost = f"rmqs-fresh-{uuid.uuid4().hex[:8]}"
    management("PUT", f"vhosts/{vhost}")
    try:
        management(
            "PUT", f"permissions/{vhost}/{broker.username}", {"configure": ".*", "write": ".*", "read": ".*"}
        )
        fresh = dataclasses.replace(broker, vhost=vhost)
        conn = conn_of(fresh)
        client(fresh).create_stream("orders")
        publish(fresh, "orders", [b"m%d" % i for i in range(30)])
        batches: list[Any] = []
        summary = run_consume(conn, jobs.plan_read(conn, stream="orders", consumer="first"), batches.append)
        assert _offsets_of(batches) == [("orders", o) for o in range(30)]
        assert summary.rows == 30
        again: list[Any] = []
        run_consume(conn, jobs.plan_read(conn, stream="orders", consumer="first"), again.append)
        assert _offsets_of(again) == []
    finally:
        management("DELETE", f"vhosts/{vhost}")
