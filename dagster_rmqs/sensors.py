"""Sensors: compare tails with the watermark (metadata calls, no messages, no JVM).

`build_new_data_sensor` requests a run of a stream asset when its consumer lags; its cursor is the
JSON of the tails (`{"orders-0": 1500}`, next offsets) as of the last request: a range is requested
once. For offset-range partitioned assets it adds one partition per partition stream and new range
instead, at most once per `min_range_interval_s` unless the range reached `max_range_messages`
(cursor `{"tails": {...}, "added_at": <epoch seconds>}`), so the number of keys stays bounded.
`build_observation_sensor` records the stream's tails and lag as `AssetObservation`s carrying a data
version derived from the tails, only when the tails changed (its cursor is the tails it last saw).
"""

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

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
    TimeWindowPartitionsDefinition,
    sensor,
)

from dagster_rmqs.partitions import offset_range_key, range_run_key
from dagster_rmqs.resources import RabbitMQStreamsResource
from dagster_rmqs.targets import stream_target
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.watermarks import Watermarks

DATA_VERSION_TAG = "dagster/data_version"  # what Dagster reads an observation's data version from
DEFAULT_RANGE_INTERVAL_S = 3600.0


def _cursor(text: str | None) -> dict[str, int] | None:
    return _range_cursor(text)[0]


def _range_cursor(text: str | None) -> tuple[dict[str, int] | None, float | None]:
    """Tails and the time the last range was added (None: never); a flat tails map is read too."""
    if not text:
        return None, None
    try:
        raw: Any = json.loads(text)
        added_at = None
        if isinstance(raw, dict) and "tails" in raw:
            added_at = float(raw["added_at"]) if raw.get("added_at") is not None else None
            raw = raw["tails"]
        return {str(k): int(v) for k, v in raw.items()}, added_at
    except (ValueError, AttributeError, TypeError, KeyError):
        return None, None  # a cursor of another format: start over from the watermark


def _lag_text(w: Watermarks) -> str:
    parts = ", ".join(f"{p.stream}={p.lag}" for p in w.partitions)
    return f"consumer '{w.consumer}' lags {w.total_lag} message(s) on '{w.target}' ({parts})"


def _broker(context: SensorEvaluationContext, given: Mapping[str, Any], key: str) -> RabbitMQStreamsResource:
    """The resource under `key` (a direct call of the sensor passes it as a keyword argument)."""
    return given[key] if key in given else getattr(context.resources, key)


def evaluate_new_data(
    w: Watermarks,
    cursor: str | None,
    min_messages: int,
    partitions_def: DynamicPartitionsDefinition | None = None,
    *,
    min_range_interval_s: float = DEFAULT_RANGE_INTERVAL_S,
    max_range_messages: int | None = None,
    now: float | None = None,
) -> SensorResult:
    """The sensor's decision from watermarks and its cursor (pure: no broker call)."""
    tails = w.tails()
    last, added_at = _range_cursor(cursor)
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
    # Partitioned: new ranges start where the last request ended (after the watermark the first
    # time), even below what retention kept: a key that starts there makes its materialization
    # report the removed offsets as data loss (failOnDataLoss), instead of no key ever naming them.
    new: dict[str, tuple[int, int]] = {}
    for p in w.partitions:
        after = p.first if p.stored is None else p.stored + 1
        start = last.get(p.stream, after) if last is not None else after
        if p.tail > start:
            new[p.stream] = (start, p.tail)
    count = sum(b - a for a, b in new.values())
    if count < min_messages:
        what = "no new messages" if not count else f"{count} new message(s)"
        return SensorResult(skip_reason=f"{what} since the last partition; waiting for {min_messages}")
    now = time.time() if now is None else now
    due = added_at is None or now - added_at >= min_range_interval_s
    big = max_range_messages is not None and count >= max_range_messages
    if not (due or big):
        assert added_at is not None
        size = f" or {max_range_messages} messages" if max_range_messages else ""
        return SensorResult(
            skip_reason=f"{count} new message(s) since the last partition; the next range is added "
            f"{added_at + min_range_interval_s - now:.0f} s from now{size} (min_range_interval_s)"
        )
    keys = [offset_range_key(s, a, b) for s, (a, b) in sorted(new.items())]
    assert partitions_def.name is not None
    new_tails = {**(last or {}), **{s: b for s, (_, b) in new.items()}}
    return SensorResult(
        run_requests=[RunRequest(run_key=k, partition_key=k) for k in keys],
        dynamic_partitions_requests=[AddDynamicPartitionsRequest(partitions_def.name, keys)],
        cursor=json.dumps({"tails": new_tails, "added_at": now}, sort_keys=True),
    )


def build_new_data_sensor(
    asset: AssetsDefinition,
    min_messages: int = 1,
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    min_range_interval_s: float = DEFAULT_RANGE_INTERVAL_S,
    max_range_messages: int | None = None,
    rabbitmq_key: str | None = None,
) -> SensorDefinition:
    """A sensor running `asset` (from `build_stream_asset`) once its consumer lags `min_messages`.

    For offset-range partitions, a new range (one key per partition stream) is added at most once
    per `min_range_interval_s` (default an hour: 24 keys a day per partition stream), earlier when
    it holds `max_range_messages`. The broker is the asset's resource key unless `rabbitmq_key`.
    """
    if min_messages < 1:
        raise ConfigurationError(f"min_messages must be at least 1; got {min_messages}")
    if min_range_interval_s < 0 or (max_range_messages is not None and max_range_messages < 1):
        raise ConfigurationError(
            "min_range_interval_s must be >= 0 and max_range_messages >= 1; got "
            f"{min_range_interval_s} and {max_range_messages}"
        )
    target = stream_target(asset)
    key = rabbitmq_key or target.rabbitmq_key
    consumer = target.require_consumer(asset.key.to_user_string())
    pdef = asset.partitions_def
    if isinstance(pdef, TimeWindowPartitionsDefinition):
        raise ConfigurationError(
            "time-window partitioned assets need no new-data sensor: give build_stream_asset an "
            "automation_condition (AutomationCondition.on_cron(...) or eager()) or use a schedule"
        )
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
        required_resource_keys={key},
    )
    def _new_data(context: SensorEvaluationContext, **given: Any) -> SensorResult:
        rabbitmq = _broker(context, given, key)
        w = rabbitmq.watermarks(consumer, **target.kw, polling=True)  # a poll: see lookups.py
        return evaluate_new_data(
            w,
            context.cursor,
            min_messages,
            pdef,
            min_range_interval_s=min_range_interval_s,
            max_range_messages=max_range_messages,
        )

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
        meta["lag"] = MetadataValue.json(w.lags())
        meta["total_lag"] = MetadataValue.int(w.total_lag)
    return meta


def tails_data_version(tails: Mapping[str, int]) -> str:
    """A data version that changes exactly when a partition stream's tail changes."""
    text = json.dumps(dict(tails), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def evaluate_observation(spec_key: Any, w: Watermarks, cursor: str | None) -> SensorResult:
    """An observation when the tails moved since the cursor's; else a skip (pure: no broker call)."""
    tails = w.tails()
    if _cursor(cursor) == tails:
        return SensorResult(skip_reason=f"the tails of '{w.target}' have not changed: {tails}")
    version = tails_data_version(tails)
    obs = AssetObservation(
        asset_key=spec_key,
        metadata={**observation_metadata(w), "data_version": MetadataValue.text(version)},
        tags={DATA_VERSION_TAG: version},
    )
    return SensorResult(asset_events=[obs], cursor=json.dumps(tails, sort_keys=True))


def build_observation_sensor(
    spec: AssetSpec | AssetsDefinition,
    *,
    name: str | None = None,
    minimum_interval_seconds: int = 60,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    rabbitmq_key: str | None = None,
) -> SensorDefinition:
    """A sensor recording an `AssetObservation` (tails; lag of the spec's consumer) when tails change.

    The observation's data version (tag `dagster/data_version`) is derived from the tails, so
    Dagster sees a new version of the stream exactly when messages were added.
    """
    target = stream_target(spec)
    key = rabbitmq_key or target.rabbitmq_key

    @sensor(
        name=name or f"{spec.key.to_python_identifier()}_observation",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Observes the tails (and consumer lag) of '{target.name}'",
        required_resource_keys={key},
    )
    def _observe(context: SensorEvaluationContext, **given: Any) -> SensorResult:
        rabbitmq = _broker(context, given, key)
        w = rabbitmq.watermarks(target.consumer_name or "", **target.kw)
        return evaluate_observation(spec.key, w, context.cursor)

    return _observe
