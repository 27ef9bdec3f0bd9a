"""Stream assets and the lag check with `materialize()`, a real broker and the session's Spark."""

from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    ExecuteInProcessResult,
    RetryPolicy,
    asset,
    materialize,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from pyspark.sql import DataFrame, SparkSession

from dagster_rmqs import (
    RabbitMQStreamsResource,
    SparkSessionResource,
    build_lag_check,
    build_stream_asset,
    offset_range_key,
    offset_range_partitions,
)
from pyspark_rmqs.core.errors import BrokerUnavailableError
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster
SHUFFLE = {"spark.sql.shuffle.partitions": "2"}  # as the session fixture has it


def values(spark: SparkSession, path: Path) -> list[bytes]:
    return sorted(bytes(r.value) for r in spark.read.parquet(str(path)).collect())


def meta(result: ExecuteInProcessResult, name: str) -> dict[str, Any]:
    (m,) = result.asset_materializations_for_node(name)
    return {k: v.value for k, v in m.metadata.items()}


def retries(result: ExecuteInProcessResult) -> int:
    return sum(1 for e in result.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY)


def test_materialize_drains_exactly_the_published_rows_then_nothing(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    s = streams.stream()
    bodies = [f"m{i}".encode() for i in range(60)]
    publish(broker, s, bodies)
    out = tmp_path / "out"
    asset = build_stream_asset("events", stream=s, consumer_name="dg", output_path=str(out))
    # SparkSessionResource's getOrCreate finds the test session (a fresh process would start one).
    resources = {"rabbitmq": rabbitmq, "spark": SparkSessionResource(spark_conf=SHUFFLE)}

    first = meta(materialize([asset], resources=resources), "events")
    assert (first["dagster/row_count"], first["bytes"], first["lag_after"]) == (60, sum(map(len, bodies)), 0)
    assert (first["start_offsets"], first["end_offsets"]) == ({s: 0}, {s: 60})
    assert first["stream_uri"] == f"rabbitmq-stream://{broker.host}:{broker.port}/%2F/{s}"
    assert first["watermark_stored"] is True and first["seconds"] > 0
    assert values(spark, out) == sorted(bodies)
    assert rabbitmq.stored_offsets("dg", stream=s) == {s: 59}

    second = meta(materialize([asset], resources=resources), "events")
    assert (second["dagster/row_count"], second["start_offsets"], second["end_offsets"]) == (
        0,
        {s: 60},
        {s: 60},
    )
    assert values(spark, out) == sorted(bodies)
    assert rabbitmq.stored_offsets("dg", stream=s) == {s: 59}


def test_a_failed_write_keeps_the_watermark_and_the_retry_writes_the_same_rows(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    s = streams.stream()
    publish(broker, s, [f"r{i}".encode() for i in range(40)])
    watermark_at_write: list[int | None] = []

    def flaky_sink(df: DataFrame) -> None:
        watermark_at_write.append(rabbitmq.stored_offsets("dgr", stream=s)[s])
        attempt = len(watermark_at_write)
        df.write.parquet(str(tmp_path / f"attempt{attempt}"))
        if attempt == 1:
            publish(broker, s, [f"late{i}".encode() for i in range(25)])  # arrives before the retry
            raise BrokerUnavailableError("the sink's commit failed (simulated)")

    asset = build_stream_asset(
        "flaky", stream=s, consumer_name="dgr", sink=flaky_sink, retry_policy=RetryPolicy(max_retries=1)
    )
    result = materialize([asset], resources={"rabbitmq": rabbitmq, "spark": spark})
    assert retries(result) == 1
    assert watermark_at_write == [None, None]  # the failure left the watermark alone
    # The retry read the recorded plan, not the 25 messages that arrived after it.
    assert values(spark, tmp_path / "attempt1") == values(spark, tmp_path / "attempt2")
    assert values(spark, tmp_path / "attempt2") == sorted(f"r{i}".encode() for i in range(40))
    assert meta(result, "flaky")["dagster/row_count"] == 40
    assert rabbitmq.stored_offsets("dgr", stream=s) == {s: 39}


def test_non_retryable_errors_fail_without_retries(
    spark: SparkSession,
    rabbitmq: RabbitMQStreamsResource,
) -> None:
    asset = build_stream_asset(
        "missing",
        stream="no-such-stream-dagster",
        consumer_name="dg",
        output_path="/tmp/never",
        retry_policy=RetryPolicy(max_retries=3),
    )
    result = materialize([asset], resources={"rabbitmq": rabbitmq, "spark": spark}, raise_on_error=False)
    assert not result.success and retries(result) == 0
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert "StreamNotFoundError" in str(failure.step_failure_data.error)


def test_offset_range_partitions_read_exactly_their_ranges_in_one_job(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    name, parts = streams.super_stream(2)
    publish(broker, parts[0], [f"a{i}".encode() for i in range(40)])
    publish(broker, parts[1], [f"b{i}".encode() for i in range(20)])
    pdef = offset_range_partitions("ranges_" + name.replace("-", "_"))
    out = tmp_path / "out"
    asset = build_stream_asset(
        "ranged", superstream=name, consumer_name="dgp", output_path=str(out), partitions_def=pdef
    )
    k0a, k0b, k1 = (
        offset_range_key(parts[0], 0, 25),
        offset_range_key(parts[0], 25, 40),
        offset_range_key(parts[1], 5, 20),
    )
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(str(pdef.name), [k0a, k0b, k1])
    resources = {"rabbitmq": rabbitmq, "spark": spark}

    one = meta(materialize([asset], instance=instance, resources=resources, partition_key=k1), "ranged")
    assert (one["dagster/row_count"], one["start_offsets"], one["end_offsets"]) == (
        15,
        {parts[1]: 5},
        {parts[1]: 20},
    )
    assert values(spark, out) == sorted(f"b{i}".encode() for i in range(5, 20))

    # A single-run backfill of two keys (k0b..k1): one plan, one Spark job, exactly those ranges.
    tags = {ASSET_PARTITION_RANGE_START_TAG: k0b, ASSET_PARTITION_RANGE_END_TAG: k1}
    result = materialize([asset], instance=instance, resources=resources, tags=tags)
    mats = result.asset_materializations_for_node("ranged")
    assert sorted(str(m.partition) for m in mats) == sorted([k0b, k1])
    two = {k: v.value for k, v in mats[0].metadata.items()}
    # k1's range is already in the exactly-once output (the first materialization committed it):
    # commits are recognised per partition range, so only k0b's 15 rows are written.
    assert (two["dagster/row_count"], two["spark_reads"], two["partition_keys"]) == (15, 1, sorted([k0b, k1]))
    assert two["start_offsets"] == {parts[0]: 25, parts[1]: 5}
    assert two["end_offsets"] == {parts[0]: 40, parts[1]: 20}
    expected = [f"a{i}".encode() for i in range(25, 40)] + [f"b{i}".encode() for i in range(5, 20)]
    assert values(spark, out) == sorted(expected)
    assert rabbitmq.stored_offsets("dgp", superstream=name) == {parts[0]: None, parts[1]: None}

    # A key past the tail or of another stream is refused, not silently shortened.
    instance.add_dynamic_partitions(str(pdef.name), [offset_range_key(parts[1], 15, 99)])
    bad = materialize(
        [asset],
        instance=instance,
        resources=resources,
        partition_key=offset_range_key(parts[1], 15, 99),
        raise_on_error=False,
    )
    assert not bad.success and retries(bad) == 0


def test_lag_check_fails_when_behind_blocks_downstream_and_passes_after_a_drain(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    s = streams.stream()
    publish(broker, s, [b"l"] * 25)
    out = str(tmp_path / "o")
    capped = build_stream_asset("lagging", stream=s, consumer_name="dgl", output_path=out, max_messages=5)
    full = build_stream_asset("lagging", stream=s, consumer_name="dgl", output_path=out)
    resources = {"rabbitmq": rabbitmq, "spark": spark}

    @asset(deps=[capped])
    def downstream() -> None:
        return None

    check = build_lag_check(capped, max_lag=10)
    alone = materialize(
        [capped, check], resources=resources, selection=AssetSelection.checks(check), raise_on_error=False
    )
    (evaluation,) = alone.get_asset_check_evaluations()
    assert not evaluation.passed
    assert (evaluation.metadata["total_lag"].value, evaluation.metadata["lag"].value) == (25, {s: 25})

    blocked = materialize([capped, check, downstream], resources=resources, raise_on_error=False)
    assert meta(blocked, "lagging")["dagster/row_count"] == 5  # read, but still 20 behind
    (evaluation,) = blocked.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["total_lag"].value == 20
    assert not blocked.asset_materializations_for_node("downstream")  # the blocking check held it back

    drained = materialize([full, build_lag_check(full, max_lag=10)], resources=resources)
    (evaluation,) = drained.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.metadata["total_lag"].value == 0
    assert meta(drained, "lagging")["dagster/row_count"] == 20


def test_available_now_mode_drains_with_a_checkpoint(
    spark: SparkSession,
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
    tmp_path: Path,
) -> None:
    s = streams.stream()
    bodies = [f"d{i}".encode() for i in range(50)]
    publish(broker, s, bodies)
    out = tmp_path / "out"
    asset = build_stream_asset(
        "drained",
        stream=s,
        consumer_name="dgd",
        output_path=str(out),
        mode="available_now",
        checkpoint_location=str(tmp_path / "checkpoint"),
    )
    m = meta(materialize([asset], resources={"rabbitmq": rabbitmq, "spark": spark}), "drained")
    assert (m["dagster/row_count"], m["end_offsets"], m["lag_after"]) == (50, {s: 50}, 0)
    assert values(spark, out) == sorted(bodies)
    assert rabbitmq.stored_offsets("dgd", stream=s) == {s: 49}
    # The standard run metrics of the drain: its asset key, and what the file sink committed.
    assert (m["rmqs/pipeline"], m["rmqs/retry_count"], m["rmqs/records_written"]) == ("drained", 0, 50)
    assert m["rmqs/bytes_read"] == sum(map(len, bodies))
