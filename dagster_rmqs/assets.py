"""`build_stream_asset`: a plain Dagster asset that is a thin wrapper over `pyspark_rmqs.jobs`.

The watermark protocol (DESIGN §4) lives in `jobs`; this module only maps Dagster's world onto it:
resources -> connection and session, partition keys -> explicit ranges, errors -> retry or not,
the run summary -> materialization metadata. The asset's definition metadata (`rmqs/...`) names its
stream and consumer, so sensors and checks built from the asset need nothing else.
"""

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    RetryPolicy,
    asset,
)

from dagster_rmqs.partitions import range_layers
from dagster_rmqs.resources import session_of, stream_uri
from pyspark_rmqs import errors
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.jobs import ReadPlan, RunSummary, plan_read, run_drain, run_read, write_output
from pyspark_rmqs.options import ConnectionOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

META_STREAM = "rmqs/stream"
META_SUPERSTREAM = "rmqs/superstream"
META_CONSUMER = "rmqs/consumer_name"
META_MODE = "rmqs/mode"


@dataclass(frozen=True)
class StreamTarget:
    """What a stream asset or spec reads: a stream or a super stream, and the watermark's consumer."""

    stream: str | None
    superstream: str | None
    consumer_name: str | None

    @property
    def name(self) -> str:
        return str(self.superstream or self.stream)

    @property
    def kw(self) -> dict[str, str | None]:
        return {"stream": self.stream, "superstream": self.superstream}

    def require_consumer(self, asset_key: str) -> str:
        if not self.consumer_name:
            raise ConfigurationError(f"asset '{asset_key}' names no consumer_name")
        return self.consumer_name

    def metadata(self) -> dict[str, str]:
        meta = {META_SUPERSTREAM if self.superstream else META_STREAM: self.name}
        if self.consumer_name:
            meta[META_CONSUMER] = self.consumer_name
        return meta


def _target(stream: str | None, superstream: str | None, consumer_name: str | None) -> StreamTarget:
    if (stream is None) == (superstream is None):
        raise ConfigurationError("give exactly one of 'stream' or 'superstream'")
    return StreamTarget(stream, superstream, consumer_name)


def stream_target(asset_or_spec: AssetsDefinition | AssetSpec) -> StreamTarget:
    """The target of an asset built by `build_stream_asset` or a spec from `stream_asset_spec`."""
    if isinstance(asset_or_spec, AssetSpec):
        meta: Mapping[str, Any] = asset_or_spec.metadata
    else:
        meta = asset_or_spec.metadata_by_key.get(asset_or_spec.key, {})

    def text(key: str) -> str | None:
        v = meta.get(key)
        v = getattr(v, "value", v)
        return None if v is None else str(v)

    if text(META_STREAM) is None and text(META_SUPERSTREAM) is None:
        raise ConfigurationError(
            f"asset '{asset_or_spec.key.to_user_string()}' names no stream: build it with "
            "build_stream_asset or stream_asset_spec"
        )
    return StreamTarget(text(META_STREAM), text(META_SUPERSTREAM), text(META_CONSUMER))


def stream_asset_spec(
    key: str | Sequence[str],
    *,
    stream: str | None = None,
    superstream: str | None = None,
    consumer_name: str | None = None,
    group_name: str | None = None,
    description: str | None = None,
) -> AssetSpec:
    """The external stream as an asset (observed by `build_observation_sensor`, a dep of readers)."""
    target = _target(stream, superstream, consumer_name)
    return AssetSpec(
        key,
        metadata=target.metadata(),
        group_name=group_name,
        description=description or f"RabbitMQ {'super ' if superstream else ''}stream '{target.name}'",
        kinds={"rabbitmq"},
    )


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
    sink: "Callable[[DataFrame], Any] | None" = None,
    mode: Literal["batch", "available_now"] = "batch",
    checkpoint_location: str | None = None,
    source_options: Mapping[str, str] | None = None,
    metadata_fields: str | None = None,
    starting_offsets: Literal["earliest", "latest"] = "earliest",
    fail_on_data_loss: bool = True,
    max_messages: int | None = None,
    partitions_def: DynamicPartitionsDefinition | None = None,
    backfill_policy: BackfillPolicy | None = None,
    retry_policy: RetryPolicy | None = None,
    drain_timeout_s: float = 3600.0,
    key_prefix: str | Sequence[str] | None = None,
    group_name: str | None = None,
    description: str | None = None,
    deps: Sequence[Any] | None = None,
    owners: Sequence[str] | None = None,
    tags: Mapping[str, str] | None = None,
    pool: str | None = None,
) -> AssetsDefinition:
    """An asset reading `[watermark + 1, tail)` of a (super) stream into a sink, then moving the watermark.

    `mode="available_now"` drains with a Structured Streaming query (`checkpoint_location` needed).
    With `partitions_def` (offset-range keys) a run reads exactly its keys' ranges and leaves the
    watermark alone; a single-run backfill (the default policy then) reads them in one Spark job.
    `sink` replaces the file output (`output_*`) with any function writing the DataFrame.
    The asset needs the resources `rabbitmq` (RabbitMQStreamsResource) and `spark`
    (SparkSessionResource or a SparkSession).
    `pool` (default `rmqs-<consumer_name>`, see `consumer_pool`) is the Dagster concurrency pool:
    with a limit of 1 on it, two materializations of one consumer's watermark never run at once. A
    retry after a failed run reads exactly the range that run recorded (DESIGN §4).
    """
    target = _target(stream, superstream, consumer_name)
    if not consumer_name:
        raise ConfigurationError("consumer_name is required: its stored offset is the asset's watermark")
    if mode not in ("batch", "available_now"):
        raise ConfigurationError(f"mode must be 'batch' or 'available_now'; got {mode!r}")
    if max_messages is not None and max_messages < 1:
        raise ConfigurationError(f"max_messages must be at least 1; got {max_messages}")
    if mode == "available_now":
        if not output_path or not checkpoint_location:
            raise ConfigurationError("mode='available_now' needs output_path and checkpoint_location")
        if sink is not None or partitions_def is not None or max_messages is not None:
            raise ConfigurationError(
                "mode='available_now' drains everything into output_path: sink, partitions_def and "
                "max_messages are for mode='batch' (use source_options maxRecordsPerTrigger to bound batches)"
            )
    elif sink is None and not output_path:
        raise ConfigurationError("give output_path (with output_format) or a sink")
    if partitions_def is not None and not isinstance(partitions_def, DynamicPartitionsDefinition):
        raise ConfigurationError("partitions_def must be offset-range partitions (offset_range_partitions)")
    write: Callable[[DataFrame], Any] = sink or write_output(
        str(output_path), output_format, output_mode, output_options, list(partition_by or []) or None
    )
    if partitions_def is not None and backfill_policy is None:
        backfill_policy = BackfillPolicy.single_run()

    def materialize(context: AssetExecutionContext) -> MaterializeResult:
        rabbitmq = context.resources.rabbitmq
        with _failures():
            conn = rabbitmq.connection_options()
            uri = stream_uri(conn, target.name)
            if mode == "available_now":
                context.log.info(f"draining '{target.name}' as consumer '{consumer_name}' (AvailableNow)")
                summary = run_drain(
                    session_of(context.resources.spark),
                    conn,
                    **target.kw,
                    consumer=consumer_name,
                    checkpoint=str(checkpoint_location),
                    output_path=str(output_path),
                    output_format=output_format,
                    output_options=output_options,
                    source_options={
                        **({"metadataFields": metadata_fields} if metadata_fields else {}),
                        **dict(source_options or {}),
                    },
                    timeout_s=drain_timeout_s,
                )
                return _result(summary, uri)
            if partitions_def is not None:  # a key or a range of keys (single-run backfill)
                return _read_partitions(context, conn, target, write, uri, metadata_fields, fail_on_data_loss)
            plan = plan_read(
                conn,
                stream=target.stream,
                superstream=target.superstream,
                consumer=consumer_name,
                start="watermark",
                end="latest",
                max_messages=max_messages,
                starting_offsets=starting_offsets,
                fail_on_data_loss=fail_on_data_loss,
            )
            again = " (the pending plan of a failed run)" if plan.resumed else ""
            context.log.info(f"reading {_describe(plan)} as consumer '{consumer_name}'{again}")
            # Nothing new: no session (run_read touches Spark only for a non-empty plan).
            spark: Any = None if plan.is_empty else session_of(context.resources.spark)
            summary = run_read(spark, conn, plan, write, metadata_fields=metadata_fields)
            return _result(summary, uri)

    with warnings.catch_warnings():  # BackfillPolicy is beta in Dagster 1.13; single-run is the point
        warnings.filterwarnings("ignore", message=".*backfill_policy.*")
        return asset(
            name=name,
            key_prefix=key_prefix,
            group_name=group_name,
            description=description
            or f"Messages of RabbitMQ {'super ' if superstream else ''}stream '{target.name}' read by "
            f"consumer '{consumer_name}' into {output_path or 'a sink'}",
            deps=deps,
            metadata={**target.metadata(), META_MODE: mode},
            required_resource_keys={"rabbitmq", "spark"},
            partitions_def=partitions_def,
            backfill_policy=backfill_policy,
            retry_policy=retry_policy,
            owners=owners,
            tags=tags,
            kinds={"spark", "rabbitmq"},
            pool=pool or consumer_pool(consumer_name),
        )(materialize)


def consumer_pool(consumer_name: str) -> str:
    """The default Dagster concurrency pool of the assets reading as `consumer_name`."""
    return f"rmqs-{consumer_name}"


def _read_partitions(
    context: AssetExecutionContext,
    conn: ConnectionOptions,
    target: StreamTarget,
    write: "Callable[[DataFrame], Any]",
    uri: str,
    metadata_fields: str | None,
    fail_on_data_loss: bool,
) -> MaterializeResult:
    """Read exactly the selected offset-range keys (one Spark job per gap depth); keep the watermark."""
    keys = list(context.partition_keys)
    layers = range_layers(keys)
    spark = session_of(context.resources.spark)
    summaries: list[RunSummary] = []
    for ranges in layers:
        plan = plan_read(
            conn,
            stream=target.stream,
            superstream=target.superstream,
            consumer=target.consumer_name,
            start={s: a for s, (a, _) in ranges.items()},
            end={s: b for s, (_, b) in ranges.items()},
            fail_on_data_loss=fail_on_data_loss,
        )
        unknown = sorted(set(ranges) - set(plan.start))
        if unknown:
            raise ConfigurationError(
                f"partition keys name {unknown}, which are not streams of '{target.name}'"
            )
        short = {s: (b, plan.end[s]) for s, (_, b) in ranges.items() if plan.end[s] < b}
        if short:
            raise ConfigurationError(f"partition ranges end past the tails of their streams: {short}")
        # Streams no key names read nothing (plan_read would read them from first offset to tail).
        plan = replace(plan, end={s: (plan.end[s] if s in ranges else plan.start[s]) for s in plan.start})
        context.log.info(f"reading {_describe(plan)} for {len(keys)} partition key(s); watermark unchanged")
        summaries.append(
            run_read(spark, conn, plan, write, store_watermark=False, metadata_fields=metadata_fields)
        )
    total = _combine(summaries, layers)
    result = _result(total, uri)
    meta = dict(result.metadata or {})
    meta["partition_keys"] = MetadataValue.json(sorted(keys))
    meta["spark_reads"] = len(layers)
    return MaterializeResult(metadata=meta)


def _combine(summaries: list[RunSummary], layers: list[dict[str, tuple[int, int]]]) -> RunSummary:
    named = {s for layer in layers for s in layer}
    start = {s: min(layer[s][0] for layer in layers if s in layer) for s in named}
    end = {s: max(layer[s][1] for layer in layers if s in layer) for s in named}

    def total(attr: str) -> int | None:
        values = [getattr(s, attr) for s in summaries]
        return None if any(v is None for v in values) else sum(values)

    return RunSummary(
        summaries[0].target if summaries else "",
        start,
        end,
        rows=total("rows"),
        bytes=total("bytes"),
        seconds=round(sum(s.seconds for s in summaries), 3),
        lag_after=summaries[-1].lag_after if summaries else None,
        watermark_stored=False,
    )


def _describe(plan: ReadPlan) -> str:
    ranges = ", ".join(f"{s} [{a}, {b})" for s, (a, b) in sorted(plan.ranges.items())) or "nothing new"
    return f"{'super stream' if plan.superstream else 'stream'} '{plan.target}': {ranges}"


def _result(summary: RunSummary, uri: str) -> MaterializeResult:
    """Materialization metadata from a run summary (no connection details, no secrets)."""
    meta: dict[str, Any] = {
        "stream_uri": MetadataValue.url(uri),
        "start_offsets": MetadataValue.json(dict(summary.start_offsets)),
        "end_offsets": MetadataValue.json(dict(summary.end_offsets)),
        "seconds": MetadataValue.float(float(summary.seconds)),
        "watermark_stored": MetadataValue.bool(summary.watermark_stored),
    }
    for k in ("rows", "bytes", "lag_after"):
        v = getattr(summary, k)
        if v is not None:
            meta[k] = MetadataValue.int(int(v))
    for k, v in summary.extra.items():
        meta[k] = v
    return MaterializeResult(metadata=meta)


@contextmanager
def _failures() -> Iterator[None]:
    """Non-retryable errors become `Failure(allow_retries=False)`; transient ones propagate (retry)."""
    try:
        yield
    except Failure:
        raise
    except Exception as e:
        verdict = errors.classify(e)
        if verdict.retryable:
            raise
        spark = "" if isinstance(e, errors.RmqsError) else " (raised in Spark)"
        raise Failure(description=f"{verdict.message}{spark}", allow_retries=False) from e
