"""Sensors against the real broker: metadata only, no Spark."""

import json
import time

import pytest
from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    SensorDefinition,
    SensorResult,
    build_sensor_context,
)

from dagster_rmqs import (
    RabbitMQStreamsResource,
    build_new_data_sensor,
    build_observation_sensor,
    build_stream_asset,
    offset_range_key,
    offset_range_partitions,
    range_run_key,
    stream_asset_spec,
)
from pyspark_rmqs.core.errors import ConfigurationError
from tests.conftest import StreamFactory
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.dagster


def tick(
    sensor: SensorDefinition, rabbitmq: RabbitMQStreamsResource, cursor: str | None = None
) -> SensorResult:
    result = sensor(build_sensor_context(cursor=cursor, resources={"rabbitmq": rabbitmq}))
    assert isinstance(result, SensorResult)
    return result


def skipped(result: SensorResult) -> str:
    assert not result.run_requests and result.skip_reason is not None
    return str(result.skip_reason.skip_message)


def test_new_data_sensor_requests_the_pending_range_once(
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
) -> None:
    s = streams.stream()
    asset = build_stream_asset("events", stream=s, consumer_name="dg", output_path="/tmp/unused")
    sensor = build_new_data_sensor(asset, min_messages=10)

    empty = tick(sensor, rabbitmq)
    assert "lags 0" in skipped(empty)

    publish(broker, s, [b"x"] * 5)
    few = tick(sensor, rabbitmq)
    assert "waiting for 10" in skipped(few)

    publish(broker, s, [b"y"] * 7)
    t0 = time.monotonic()
    hit = tick(sensor, rabbitmq)
    assert time.monotonic() - t0 < 10  # metadata only: far inside Dagster's 60 s limit
    assert [r.run_key for r in hit.run_requests or []] == [range_run_key({s: (0, 12)})]
    assert hit.cursor is not None and json.loads(hit.cursor) == {s: 12}

    again = tick(sensor, rabbitmq, cursor=hit.cursor)  # the run has not moved the watermark yet
    assert "no new messages" in skipped(again)

    rabbitmq.store_watermarks("dg", {s: 11})  # what a successful run does
    done = tick(sensor, rabbitmq, cursor=hit.cursor)
    assert "lags 0" in skipped(done)
    assert rabbitmq.lags("dg", stream=s) == {s: 0} and rabbitmq.lag("dg", stream=s) == 0


def test_partitioned_sensor_adds_one_range_per_partition_stream(
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
) -> None:
    name, parts = streams.super_stream(2)
    pdef = offset_range_partitions("ranges_" + name.replace("-", "_"))
    asset = build_stream_asset(
        "ranged", superstream=name, consumer_name="dgp", output_path="/tmp/unused", partitions_def=pdef
    )
    sensor = build_new_data_sensor(asset, min_range_interval_s=0)  # every tick (see the throttle test)
    publish(broker, parts[0], [b"a"] * 30)
    publish(broker, parts[1], [b"b"] * 20)
    first = tick(sensor, rabbitmq)
    keys = [offset_range_key(parts[0], 0, 30), offset_range_key(parts[1], 0, 20)]
    assert [(r.partition_key, r.run_key) for r in first.run_requests or []] == [(k, k) for k in keys]
    assert first.dynamic_partitions_requests == [AddDynamicPartitionsRequest(pdef.name, keys)]  # type: ignore[arg-type]

    publish(broker, parts[1], [b"c"] * 4)
    second = tick(sensor, rabbitmq, cursor=first.cursor)  # continues from the cursor, not the watermark
    assert [r.partition_key for r in second.run_requests or []] == [offset_range_key(parts[1], 20, 24)]
    assert json.loads(second.cursor or "")["tails"] == {parts[0]: 30, parts[1]: 24}
    quiet = tick(sensor, rabbitmq, cursor=second.cursor)
    assert not quiet.run_requests and quiet.skip_reason is not None


def test_observation_sensor_records_tails_and_lag(
    broker: BrokerSettings,
    streams: StreamFactory,
    rabbitmq: RabbitMQStreamsResource,
) -> None:
    s = streams.stream()
    publish(broker, s, [b"o"] * 8)
    rabbitmq.store_watermarks("obs", {s: 2})
    spec = stream_asset_spec(["raw", "events"], stream=s, consumer_name="obs")
    result = tick(build_observation_sensor(spec), rabbitmq)
    (obs,) = result.asset_events
    assert obs.asset_key == AssetKey(["raw", "events"])
    assert obs.metadata["tails"].value == {s: 8}
    assert obs.metadata["lag"].value == {s: 5}
    assert obs.metadata["total_lag"].value == 5
    assert rabbitmq.tails(stream=s) == {s: 8}
    assert rabbitmq.stored_offsets("obs", stream=s) == {s: 2}


def test_sensor_factories_validate_their_asset() -> None:
    asset = build_stream_asset("a", stream="s", consumer_name="c", output_path="/tmp/unused")
    with pytest.raises(ConfigurationError, match="min_messages"):
        build_new_data_sensor(asset, min_messages=0)
    with pytest.raises(ConfigurationError, match="exactly one"):
        build_stream_asset("b", consumer_name="c", output_path="/tmp/unused")
    with pytest.raises(ConfigurationError, match="checkpoint_location"):
        build_stream_asset("b", stream="s", consumer_name="c", output_path="/x", mode="available_now")
