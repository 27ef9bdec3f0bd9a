"""`build_stream_asset`: the documented entry point; it checks its arguments and picks a factory.

The watermark protocol (DESIGN §4) lives in `pyspark_rmqs.runs.steps`; the factories (factories.py) map
Dagster's world onto it: resources -> connection and session, partition keys and time windows ->
explicit ranges, errors -> retry or not, the run summary -> standard metadata. The asset's
definition metadata (`rmqs/...`) names its stream, consumer and resource key, so sensors and
checks built from the asset need nothing else.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from dagster import (
    AssetsDefinition,
    AutomationCondition,
    BackfillPolicy,
    DynamicPartitionsDefinition,
    FreshnessPolicy,
    PartitionsDefinition,
    RetryPolicy,
    TimeWindowPartitionsDefinition,
)

from dagster_rmqs.engines import EngineName, Output, make_engine
from dagster_rmqs.factories import (
    AssetAttributes,
    StreamRead,
    consumer_pool,
    drain_asset,
    offset_range_asset,
    time_window_asset,
    watermark_asset,
)
from dagster_rmqs.failures import failures as _failures
from dagster_rmqs.targets import (
    DEFAULT_RABBITMQ_KEY,
    DEFAULT_SPARK_KEY,
    META_CONSUMER,
    META_MODE,
    META_STREAM,
    META_SUPERSTREAM,
    StreamTarget,
    make_target,
    stream_asset_spec,
    stream_target,
)
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.runs.outputs.delivery import check_delivery

__all__ = [
    "META_CONSUMER",
    "META_MODE",
    "META_STREAM",
    "META_SUPERSTREAM",
    "AssetAttributes",
    "StreamTarget",
    "_failures",
    "build_stream_asset",
    "consumer_pool",
    "stream_asset_spec",
    "stream_target",
]


def build_stream_asset(
    name: str,
    *,
    stream: str | None = None,
    superstream: str | None = None,
    consumer_name: str,
    output_path: str | None = None,
    output_format: str = "parquet",
    output_mode: str = "append",
    output_options: Mapping[str, str] | None = None,
    partition_by: Sequence[str] | None = None,
    sink: Callable[[Any], Any] | None = None,
    mode: Literal["batch", "available_now"] = "batch",
    engine: EngineName = "spark",
    checkpoint_location: str | None = None,
    source_options: Mapping[str, str] | None = None,
    metadata_fields: str | None = None,
    delivery: str = "exactly_once",
    starting_offsets: Literal["earliest", "latest"] = "earliest",
    fail_on_data_loss: bool = True,
    max_messages: int | None = None,
    partitions_def: PartitionsDefinition | None = None,
    allow_open_windows: bool | None = None,
    drain_timeout_s: float = 3600.0,
    rabbitmq_key: str = DEFAULT_RABBITMQ_KEY,
    spark_key: str = DEFAULT_SPARK_KEY,
    output_storage_key: str | None = None,
    key_prefix: str | Sequence[str] | None = None,
    group_name: str | None = None,
    description: str | None = None,
    deps: Sequence[Any] | None = None,
    owners: Sequence[str] | None = None,
    tags: Mapping[str, str] | None = None,
    kinds: set[str] | None = None,
    pool: str | None = None,
    automation_condition: AutomationCondition | None = None,
    code_version: str | None = None,
    freshness_policy: FreshnessPolicy | None = None,
    retry_policy: RetryPolicy | None = None,
    backfill_policy: BackfillPolicy | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> AssetsDefinition:
    """An asset reading a (super) stream into an output, under the watermark protocol.

    What it reads depends on `partitions_def`:
    - none: `[watermark + 1, tail)`, then the watermark moves (`mode="available_now"`: the same as
      an AvailableNow Structured Streaming drain with `checkpoint_location`);
    - offset-range partitions (`offset_range_partitions`): exactly the selected keys' ranges;
    - any `TimeWindowPartitionsDefinition` (daily, hourly, a cron): the messages whose chunk
      timestamp falls in the window, with its bounds and whether it closed decided by the broker's
      clock; an open window reads up to the tails at run start. File outputs are kept per window
      (`<output_path>/rmqs_window=<key>/`) and a materialization replaces its window's files whole.
      A `sink` (or a table format) cannot be replaced: an open window is refused there unless
      `allow_open_windows=True` (default: allowed exactly where the output is replaced).
    Partitioned runs never move the watermark; a backfill of many keys or windows is one run (the
    default single-run backfill policy): one read for offset ranges, one per window for windows.

    `engine="spark"` (default) reads with Spark (resource `spark_key`: a SparkSession, a
    `SparkSessionResource`, or any resource with `get_session()` / `spark_session`); `sink` then
    takes the DataFrame. `engine="arrow"` reads without Spark (pyspark is never imported): Parquet
    files `<stream>-<start>-<end>-<run>.parquet` under `output_path`, or `sink` called per
    `pyarrow.RecordBatch`. The broker is the `RabbitMQStreamsResource` under `rabbitmq_key`.
    With `engine="arrow"`, `output_path` may be an object store (`s3://bucket/orders`): each
    run's objects, then its commit record (the manifest readers trust: `pyspark_rmqs.committed`);
    `output_storage_key` names an `ObjectStoreResource` holding its credentials.

    `delivery="exactly_once"` (default) commits the Spark engine's files under each run's range
    token, so a retried range is never written twice; `"at_least_once"` writes straight to
    `output_path`. A `sink` taking `token=` receives the run's token (see docs/semantics.md).

    `pool` (default `rmqs-<consumer_name>`, see `consumer_pool`) is the Dagster concurrency pool:
    with a limit of 1 on it, two materializations of one consumer's watermark never run at once.
    The other Dagster attributes (`automation_condition`, `code_version`, `freshness_policy`,
    `kinds`, `owners`, `tags`, `metadata`, ...) pass through to `@asset`; the asset's own `rmqs/*`
    metadata keys (what sensors and checks read back) win over `metadata`'s.
    """
    target = make_target(stream, superstream, consumer_name, rabbitmq_key)
    if not consumer_name:
        raise ConfigurationError("consumer_name is required: its stored offset is the asset's watermark")
    if not spark_key.isidentifier():
        raise ConfigurationError(f"spark_key must be a Python identifier; got {spark_key!r}")
    if mode not in ("batch", "available_now"):
        raise ConfigurationError(f"mode must be 'batch' or 'available_now'; got {mode!r}")
    if max_messages is not None and max_messages < 1:
        raise ConfigurationError(f"max_messages must be at least 1; got {max_messages}")
    if max_messages is not None and partitions_def is not None:
        raise ConfigurationError("max_messages caps watermark runs; a partition reads its whole range")
    if sink is None and not output_path:
        raise ConfigurationError("give output_path (with output_format) or a sink")
    if allow_open_windows is not None and not isinstance(partitions_def, TimeWindowPartitionsDefinition):
        raise ConfigurationError("allow_open_windows is for time-window partitions (partitions_def)")
    output = Output(
        output_path,
        output_format,
        output_mode,
        dict(output_options or {}),
        tuple(partition_by or ()),
        sink,
        check_delivery(delivery),
    )
    read = StreamRead(
        target,
        make_engine(
            engine,
            output,
            spark_key=spark_key,
            metadata_fields=metadata_fields,
            source_options=source_options,
            storage_key=output_storage_key,
        ),
        metadata_fields,
        fail_on_data_loss,
    )
    attrs: AssetAttributes = {
        "key_prefix": key_prefix,
        "group_name": group_name,
        "description": description,
        "deps": deps,
        "owners": owners,
        "tags": tags,
        "kinds": kinds,
        "pool": pool,
        "automation_condition": automation_condition,
        "code_version": code_version,
        "freshness_policy": freshness_policy,
        "retry_policy": retry_policy,
        "backfill_policy": backfill_policy,
        "metadata": metadata,
    }
    if mode == "available_now":
        if not output_path or not checkpoint_location:
            raise ConfigurationError("mode='available_now' needs output_path and checkpoint_location")
        if sink is not None or partitions_def is not None or max_messages is not None or engine != "spark":
            raise ConfigurationError(
                "mode='available_now' drains everything into output_path with Spark: sink, "
                "partitions_def, max_messages and engine='arrow' are for mode='batch' (use source_options "
                "maxRecordsPerTrigger to bound batches)"
            )
        return drain_asset(
            name,
            read,
            attrs,
            checkpoint_location=checkpoint_location,
            source_options=source_options,
            drain_timeout_s=drain_timeout_s,
        )
    if isinstance(partitions_def, DynamicPartitionsDefinition):
        return offset_range_asset(name, read, attrs, partitions_def=partitions_def)
    if isinstance(partitions_def, TimeWindowPartitionsDefinition):
        return time_window_asset(
            name, read, attrs, partitions_def=partitions_def, allow_open_windows=allow_open_windows
        )

    if partitions_def is not None:
        raise ConfigurationError(
            "partitions_def must be offset-range partitions (offset_range_partitions) or time windows (any "
            f"TimeWindowPartitionsDefinition: daily, hourly, a cron); got {type(partitions_def).__name__}"
        )
    return watermark_asset(
        name,
        read,
        attrs,
        starting_offsets=starting_offsets,
        max_messages=max_messages,
    )
