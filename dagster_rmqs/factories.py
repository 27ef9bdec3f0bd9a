"""One small factory per way a stream asset reads; `build_stream_asset` picks one.

- `watermark_asset`: `[watermark + 1, tail)`, then the watermark moves (the default).
- `drain_asset`: the same drain as a Structured Streaming query with `Trigger.AvailableNow`.
- `offset_range_asset`: dynamic partitions whose keys are offset ranges; the watermark stays.
- `time_window_asset`: any `TimeWindowPartitionsDefinition`; a window reads the messages whose
  chunk timestamp falls in it, `[offset at start, offset at end)` by the broker's clock
  (windows.py); each materialization replaces its window's files; the watermark stays.

Each factory wraps a small materialize function around `jobs.plan_read` and an `Engine`
(engines.py); `define` turns it into a Dagster asset with the passthrough attributes.
"""

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypedDict

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AutomationCondition,
    BackfillPolicy,
    DynamicPartitionsDefinition,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    RetryPolicy,
    TimeWindowPartitionsDefinition,
    asset,
)

from dagster_rmqs import windows
from dagster_rmqs.engines import Engine
from dagster_rmqs.failures import failures
from dagster_rmqs.metadata import combine, run_metadata
from dagster_rmqs.partitions import range_layers
from dagster_rmqs.resources import session_of, stream_uri
from dagster_rmqs.targets import META_MODE, StreamTarget
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.positions import bounds, merge_spans, timestamp_start_loss
from pyspark_rmqs.errors import ConfigurationError
from pyspark_rmqs.jobs import ReadPlan, RunSummary, plan_read
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.runs.outputs.delivery import local_path


class AssetAttributes(TypedDict, total=False):
    """Dagster asset attributes every factory passes through to `@asset` unchanged."""

    key_prefix: str | Sequence[str] | None
    group_name: str | None
    description: str | None
    deps: Sequence[Any] | None
    owners: Sequence[str] | None
    tags: Mapping[str, str] | None
    kinds: set[str] | None
    pool: str | None
    automation_condition: AutomationCondition | None
    code_version: str | None
    freshness_policy: FreshnessPolicy | None
    retry_policy: RetryPolicy | None
    backfill_policy: BackfillPolicy | None
    metadata: Mapping[str, Any] | None


@dataclass(frozen=True)
class StreamRead:
    """What every mode shares: the target, the engine, and how to read."""

    target: StreamTarget
    engine: Engine
    metadata_fields: str | None = None
    fail_on_data_loss: bool = True

    def connection(self, context: AssetExecutionContext) -> ConnectionOptions:
        return getattr(context.resources, self.target.rabbitmq_key).connection_options()

    def plan(self, conn: ConnectionOptions, **kw: Any) -> ReadPlan:
        return plan_read(
            conn,
            **self.target.target.kw(),
            consumer=self.target.consumer_name,
            fail_on_data_loss=self.fail_on_data_loss,
            **kw,
        )

    def result(
        self, conn: ConnectionOptions, summary: RunSummary, extra: Mapping[str, Any] | None = None
    ) -> MaterializeResult:
        meta = run_metadata(
            summary,
            source_uri=stream_uri(conn, self.target.name),
            output_uri=self.engine.output.uri,
            metadata_fields=self.metadata_fields,
            extra={"engine": self.engine.name, **(extra or {})},
        )
        return MaterializeResult(metadata=meta)


def describe(plan: ReadPlan) -> str:
    ranges = ", ".join(f"{s} [{a}, {b})" for s, (a, b) in sorted(plan.ranges.items())) or "nothing new"
    return f"{'super stream' if plan.superstream else 'stream'} '{plan.target}': {ranges}"


def define(
    name: str,
    read: StreamRead,
    mode: str,
    fn: Callable[[AssetExecutionContext], MaterializeResult],
    attrs: AssetAttributes,
    *,
    partitions_def: PartitionsDefinition | None = None,
) -> AssetsDefinition:
    """The Dagster asset: `fn` plus the target's metadata, resource keys and passthrough attributes.

    It needs the broker resource, and the Spark resource when its engine reads with Spark.
    """
    a: dict[str, Any] = dict(attrs)
    t = read.target
    consumer = str(t.consumer_name)
    backfill = a.pop("backfill_policy", None)
    if partitions_def is not None and backfill is None:
        backfill = BackfillPolicy.single_run()  # a backfill of many keys or windows: one run
    kinds = a.pop("kinds", None) or {"rabbitmq", "spark" if read.engine.name == "spark" else "parquet"}
    spark_key = read.engine.spark_key
    keys = {t.rabbitmq_key, spark_key} if spark_key else {t.rabbitmq_key}
    if storage_key := getattr(read.engine, "storage_key", None):
        keys.add(storage_key)
    what = f"RabbitMQ {t.target.describe()}"
    description = a.pop("description", None) or (
        f"Messages of {what} read by consumer '{consumer}' into {read.engine.output.uri or 'a sink'}"
    )
    with warnings.catch_warnings():  # BackfillPolicy is beta in Dagster 1.13; single-run is the point
        warnings.filterwarnings("ignore", message=".*backfill_policy.*")
        return asset(
            name=name,
            description=description,
            metadata={**dict(a.pop("metadata", None) or {}), **t.metadata(), META_MODE: mode},
            required_resource_keys=keys,
            partitions_def=partitions_def,
            backfill_policy=backfill,
            kinds=kinds,
            pool=a.pop("pool", None) or consumer_pool(consumer),
            **a,
        )(fn)


def consumer_pool(consumer_name: str) -> str:
    """The default Dagster concurrency pool of the assets reading as `consumer_name`."""
    return f"rmqs-{consumer_name}"


def watermark_asset(
    name: str,
    read: StreamRead,
    attrs: AssetAttributes,
    *,
    starting_offsets: str = "earliest",
    max_messages: int | None = None,
) -> AssetsDefinition:
    """Reads `[watermark + 1, tail)` (or the pending plan of a failed try), then stores the watermark."""
    consumer = read.target.require_consumer(name)

    def materialize(context: AssetExecutionContext) -> MaterializeResult:
        with failures():
            conn = read.connection(context)
            plan = read.plan(
                conn,
                start="watermark",
                end="latest",
                max_messages=max_messages,
                starting_offsets=starting_offsets,
                pipeline=f"{context.asset_key.to_user_string()} (run {context.run.run_id})",
            )
            try:
                again = " (resuming the run record of a failed run)" if plan.resumed else ""
                context.log.info(f"reading {describe(plan)} as consumer '{consumer}'{again}")
                return read.result(conn, read.engine.read(context, conn, plan, store_watermark=True))
            finally:
                plan.release()

    return define(name, read, "batch", materialize, attrs)


def drain_asset(
    name: str,
    read: StreamRead,
    attrs: AssetAttributes,
    *,
    checkpoint_location: str,
    source_options: Mapping[str, str] | None = None,
    drain_timeout_s: float = 3600.0,
) -> AssetsDefinition:
    """An AvailableNow Structured Streaming drain into files; the checkpoint is the source of truth."""
    from pyspark_rmqs.jobs import run_drain

    t, out, spark_key = read.target, read.engine.output, read.engine.spark_key
    if spark_key is None:
        raise ConfigurationError("mode='available_now' drains with Spark: use engine='spark'")
    consumer = t.require_consumer(name)
    options = {
        **({"metadataFields": read.metadata_fields} if read.metadata_fields else {}),
        **dict(source_options or {}),
    }

    def materialize(context: AssetExecutionContext) -> MaterializeResult:
        with failures():
            conn = read.connection(context)
            context.log.info(f"draining '{t.name}' as consumer '{consumer}' (AvailableNow)")
            summary = run_drain(
                session_of(getattr(context.resources, spark_key)),
                conn,
                **t.target.kw(),
                consumer=consumer,
                checkpoint=checkpoint_location,
                output_path=str(out.path),
                output_format=out.format,
                output_options=dict(out.options),
                source_options=options,
                timeout_s=drain_timeout_s,
                pipeline=context.asset_key.to_user_string(),
                retry_count=context.retry_number,
            )
            return read.result(conn, summary)

    return define(name, read, "available_now", materialize, attrs)


def offset_range_asset(
    name: str,
    read: StreamRead,
    attrs: AssetAttributes,
    *,
    partitions_def: DynamicPartitionsDefinition,
) -> AssetsDefinition:
    """Partition keys are offset ranges; a run reads exactly its keys' ranges, one read per gap depth."""

    def materialize(context: AssetExecutionContext) -> MaterializeResult:
        with failures():
            conn = read.connection(context)
            keys = list(context.partition_keys)
            layers = range_layers(keys)
            summaries = []
            for ranges in layers:
                plan = _exact_plan(read, conn, ranges)
                context.log.info(
                    f"reading {describe(plan)} for {len(keys)} partition key(s); watermark unchanged"
                )
                summaries.append(read.engine.read(context, conn, plan, store_watermark=False))
            extra = {"partition_keys": MetadataValue.json(sorted(keys)), "spark_reads": len(layers)}
            return read.result(conn, combine(summaries, layers), extra)

    return define(name, read, "offset_ranges", materialize, attrs, partitions_def=partitions_def)


def _exact_plan(read: StreamRead, conn: ConnectionOptions, ranges: dict[str, tuple[int, int]]) -> ReadPlan:
    """A plan of exactly `ranges`: unknown streams and ends past the tail are errors, not trimmed."""
    plan = read.plan(
        conn,
        start={s: a for s, (a, _) in ranges.items()},
        end={s: b for s, (_, b) in ranges.items()},
        persist=False,
    )
    unknown = sorted(set(ranges) - set(plan.start))
    if unknown:
        raise ConfigurationError(
            f"partition keys name {unknown}, which are not streams of '{read.target.name}'"
        )
    short = {s: (b, plan.end[s]) for s, (_, b) in ranges.items() if plan.end[s] < b}
    if short:
        raise ConfigurationError(f"partition ranges end past the tails of their streams: {short}")
    # Streams no key names read nothing (plan_read would read them from first offset to tail).
    return replace(plan, end={s: (plan.end[s] if s in ranges else plan.start[s]) for s in plan.start})


def time_window_asset(
    name: str,
    read: StreamRead,
    attrs: AssetAttributes,
    *,
    partitions_def: TimeWindowPartitionsDefinition,
    allow_open_windows: bool | None = None,
) -> AssetsDefinition:
    """A window reads `[offset at its start, offset at its end)` by chunk timestamp, per stream.

    Start, end and whether the window closed are the broker's clock (windows.py): adjacent windows
    meet at the same offset, whatever the Dagster process's clock says. An open window reads up to
    the tails (and says so: `window_open`). Files rmqs writes are kept per window
    (`rmqs_window=<key>/`) and each materialization replaces its window's folder whole, so reading
    an open window again after it closed never adds its rows twice. A sink function (or a table
    format) cannot be replaced: there an open window is refused unless `allow_open_windows`. A
    single-run backfill reads its windows one after the other, each into its own output. The
    watermark is never read or moved.
    """
    replace_whole = windows.replaces_windows(read.engine)
    allow_open = replace_whole if allow_open_windows is None else allow_open_windows
    out = read.engine.output
    if replace_whole and out.mode not in ("append", "overwrite"):
        raise ConfigurationError(
            f"time windows replace each window's folder: output_mode must be 'append' or 'overwrite'; "
            f"got {out.mode!r}"
        )

    def materialize(context: AssetExecutionContext) -> MaterializeResult:
        with failures():
            conn = read.connection(context)
            keys = list(context.partition_keys)
            spans = [(k, partitions_def.time_window_for_partition_key(k)) for k in keys]
            client = BrokerClient(conn)
            streams = read.target.target.streams(client)
            located = windows.locate(client, streams, spans, now=datetime.now(UTC))
            still_open = [w for w in located if w.is_open]
            if still_open and not allow_open:
                raise windows.OpenWindowError(
                    f"{'; '.join(w.describe_open() for w in still_open)}. The output (a sink function "
                    "or a table format) cannot have an open window's rows replaced later: materialize "
                    "the window once it closed, or build the asset with allow_open_windows=True (the "
                    "sink then receives the window's rows again when it is materialized after it closed)"
                )
            summaries = []
            firsts = bounds(client, streams, read.fail_on_data_loss)
            for w in located:
                # A window starts by time: what retention removed may have been in it, as for any
                # read from a time (`timestamp_start_loss`: DataLossError, or the summary's data_loss).
                lost = timestamp_start_loss(client, firsts, w.start, read.fail_on_data_loss)
                plan = read.plan(conn, start=w.start_offsets, end=w.end_offsets, persist=False)
                plan.data_loss.update(merge_spans(plan.data_loss, lost))
                state = "open: up to the tails" if w.is_open else "closed by the broker's clock"
                context.log.info(
                    f"reading {describe(plan)} for window '{w.key}' [{w.start.isoformat()}, "
                    f"{w.end.isoformat()}) ({state}); watermark unchanged"
                )
                engine = windows.window_engine(read.engine, w.key) if replace_whole else read.engine
                summary = engine.read(context, conn, plan, store_watermark=False)
                if replace_whole:
                    _replace_window(engine, plan, summary, storage_of(engine, context))
                summaries.append(summary)
            if len(summaries) == 1:
                summary = summaries[0]
            else:
                layers = [
                    {s: (p, summ.end_offsets[s]) for s, p in summ.start_offsets.items()} for summ in summaries
                ]
                summary = combine(summaries, layers)
            extra = {
                "window_start": MetadataValue.timestamp(located[0].start),
                "window_end": MetadataValue.timestamp(located[-1].end),
                "window_open": MetadataValue.bool(bool(still_open)),
                "partition_keys": MetadataValue.json(keys),
            }
            if still_open:
                extra["open_windows"] = MetadataValue.json([w.key for w in still_open])
            return read.result(conn, summary, extra)

    return define(name, read, "time_windows", materialize, attrs, partitions_def=partitions_def)


def storage_of(engine: Engine, context: AssetExecutionContext) -> dict[str, Any] | None:
    """The output's storage options from the engine's `ObjectStoreResource`, if it names one."""
    options = getattr(engine, "storage_options", None)
    return options(context) if options is not None else None


def _replace_window(
    engine: Engine, plan: ReadPlan, summary: RunSummary, storage_options: dict[str, Any] | None = None
) -> None:
    """What the window's folder held before this run is gone: only this run's output stays."""
    folder = str(engine.output.path)
    if windows.commits_runs(engine) and (engine.name == "arrow" or local_path(folder) is not None):
        files = summary.extra.get("files")
        windows.keep_only(folder, plan.token, files if isinstance(files, list) else (), storage_options)
    elif plan.is_empty:  # Spark overwrote the folder when it wrote; with nothing to write, it did not
        windows.remove(folder)
