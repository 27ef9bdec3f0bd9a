"""Sensors: compare tails with the watermark (metadata calls, no messages, no JVM).

`build_new_data_sensor` requests a run of a stream asset when its consumer lags; for offset-range
partitioned assets it adds one partition per new range instead. Its cursor is the JSON of the tails
(`{"orders-0": 1500}`, next offsets) as of the last request: a range is requested once.
`build_observation_sensor` records the stream's tails and lag as `AssetObservation`s.
"""

import json
from collections.abc import Mapping

from dagster import (
    AddDynamicPartitionsRequest,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    MetadataValue,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from dagster_rmqs.assets import stream_target
from dagster_rmqs.partitions import offset_range_key, range_run_key
from dagster_rmqs.resources import RabbitMQStreamsResource
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.watermarks import Watermarks


def _cursor(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    try:
        return {str(k): int(v) for k, v in json.loads(text).items()}
    except (ValueError, AttributeError, TypeError):
        return None  # a cursor of another format: start over from the watermark


def _lag_text(w: Watermarks) -> str:
    parts = ", ".join(f"{p.stream}={p.lag}" for p in w.partitions)
    return f"consumer '{w.consumer}' lags {w.total_lag} message(s) on '{w.target}' ({parts})"


def evaluate_new_data(
    w: Watermarks,
    cursor: str | None,
    min_messages: int,
    partitions_def: DynamicPartitionsDefinition | None = None,
) -> SensorResult:
    """The sensor's decision from watermarks and its cursor (pure: no broker call)."""
    tails = w.tails()
    last = _cursor(cursor)
    if partitions_def is None:
        if w.total_lag < min_messages:
            return SensorResult(skip_reason=f"{_lag_text(w)}; waiting for {min_messages}")
        if last == tails:
            return SensorResult(skip_reason=f"no new messages since the last run request; {_lag_text(w)}")
        ranges = w.pending()
        return SensorResult(
            run_requests=[RunRequest(run_key=range_run_key(ranges), tags={"rmqs/lag": str(w.total_lag)})],
            cursor=json.dumps(tails, sort_keys=True),
        )
    # Partitioned: new ranges start where the last request ended (the watermark the first time).
    new: dict[str, tuple[int, int]] = {}
    for p in w.partitions:
        start = max(p.first, last.get(p.stream, p.next_offset) if last is not None else p.next_offset)
        if p.tail > start:
            new[p.stream] = (start, p.tail)
    count = sum(b - a for a, b in new.values())
    if count < min_messages:
        what = "no new messages" if not count else f"{count} new message(s)"
        return SensorResult(skip_reason=f"{what} since the last partition; waiting for {min_messages}")
    keys = [offset_range_key(s, a, b) for s, (a, b) in sorted(new.items())]
    assert partitions_def.name is not None
    return SensorResult(
        run_requests=[RunRequest(run_key=k, partition_key=k) for k in keys],
        dynamic_partitions_requests=[AddDynamicPartitionsRequest(partitions_def.name, keys)],
        cursor=json.dumps({**(last or {}), **{s: b for s, (_, b) in new.items()}}, sort_keys=True),
    )


def build_new_data_sensor(
    asset: AssetsDefinition,
    min_messages: int = 1,
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
) -> SensorDefinition:
    """A sensor running `asset` (from `build_stream_asset`) once its consumer lags `min_messages`."""
    if min_messages < 1:
        raise ConfigurationError(f"min_messages must be at least 1; got {min_messages}")
    target = stream_target(asset)
    consumer = target.require_consumer(asset.key.to_user_string())
    pdef = asset.partitions_def
    if pdef is not None and not (isinstance(pdef, DynamicPartitionsDefinition) and pdef.name):
        raise ConfigurationError(
            "the asset's partitions must be offset-range partitions (offset_range_partitions)"
        )

    @sensor(
        name=name or f"{asset.key.to_python_identifier()}_new_data",
        target=asset,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Runs when consumer '{consumer}' lags at least {min_messages} message(s) on "
        f"'{target.name}'",
    )
    def _new_data(context: SensorEvaluationContext, rabbitmq: RabbitMQStreamsResource) -> SensorResult:
        w = rabbitmq.watermarks(consumer, **target.kw)
        return evaluate_new_data(w, context.cursor, min_messages, pdef)

    return _new_data


def observation_metadata(w: Watermarks) -> Mapping[str, MetadataValue]:
    """Tail and lag of a stream, as observation metadata."""
    meta: dict[str, MetadataValue] = {
        "tails": MetadataValue.json(w.tails()),
        "first_offsets": MetadataValue.json({p.stream: p.first for p in w.partitions}),
        "messages": MetadataValue.int(sum(p.tail - p.first for p in w.partitions)),
    }
    if w.consumer:
        meta["consumer_name"] = MetadataValue.text(w.consumer)
        meta["lag"] = MetadataValue.json({p.stream: p.lag for p in w.partitions})
        meta["total_lag"] = MetadataValue.int(w.total_lag)
    return meta


def build_observation_sensor(
    spec: AssetSpec | AssetsDefinition,
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 60,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
) -> SensorDefinition:
    """A sensor recording an `AssetObservation` (tails; lag of the spec's consumer) each tick."""
    target = stream_target(spec)

    @sensor(
        name=name or f"{spec.key.to_python_identifier()}_observation",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Observes the tails (and consumer lag) of '{target.name}'",
    )
    def _observe(context: SensorEvaluationContext, rabbitmq: RabbitMQStreamsResource) -> SensorResult:
        w = rabbitmq.watermarks(target.consumer_name or "", **target.kw)
        obs = AssetObservation(asset_key=spec.key, metadata=observation_metadata(w))
        return SensorResult(asset_events=[obs], cursor=json.dumps(w.tails(), sort_keys=True))

    return _observe
