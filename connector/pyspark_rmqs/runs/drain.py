"""AvailableNow drains under the watermark protocol: a Structured Streaming query into files.

The checkpoint is the source of truth for what was read; the consumer's watermark moves as each
micro-batch commits, and the last batch's is stored here once the query finished, never
backwards, under the consumer name's lease. What the sink wrote is read from the file sink's own
log (`outputs.file_sink_log`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.positions import merge_spans
from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.options import ConnectionOptions, SourceOptions
from pyspark_rmqs.options.parse import parse_source_options
from pyspark_rmqs.runs import checkpoint_streams, drain_start
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.lease import DEFAULT_WAIT_S as DEFAULT_LEASE_WAIT_S
from pyspark_rmqs.runs.lease import Lease
from pyspark_rmqs.runs.lease import acquire as acquire_lease
from pyspark_rmqs.runs.outputs.file_sink_log import check_sink_log_is_this_querys
from pyspark_rmqs.runs.plan import ReadPlan
from pyspark_rmqs.runs.spark_io import ExecutorReadMetrics
from pyspark_rmqs.runs.steps import retention_during
from pyspark_rmqs.runs.summary import RunSummary
from pyspark_rmqs.runs.summary import ms_since as _ms_since
from pyspark_rmqs.runs.watermarks import Watermarks, store_watermarks, watermarks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
_SOURCE = SourceOptions.alias  # option names users type, from the option table


def run_drain(
    spark: SparkSession,
    conn: ConnectionOptions,
    *,
    stream: str | None = None,
    superstream: str | None = None,
    consumer: str,
    checkpoint: str,
    output_path: str,
    output_format: str = "parquet",
    output_options: Mapping[str, str] | None = None,
    source_options: Mapping[str, str] | None = None,
    timeout_s: float = 3600.0,
    pipeline: str | None = None,
    retry_count: int = 0,
) -> RunSummary:
    """An AvailableNow Structured Streaming drain into files; the checkpoint is the source of truth.

    The source stores `end - 1` in the broker as each micro-batch commits; Spark commits a batch
    to its source only when it plans the next, so the last batch's watermark is stored here once
    the query finished. What the sink wrote is read from the file sink's own log of the run's
    batches (`spark.file_sink_log`): Spark reports no output rows for file sinks.

    The drain holds the consumer's lease and keeps it (`Lease.keep`) before that final store: a
    lease lost under the drain is taken back, or the drain fails with `LeaseLostError` before
    storing. The source's own stores during the query are Spark's (best-effort metadata behind the
    checkpoint) and are not checked; they never move the watermark backwards.
    """
    if not consumer:
        raise ConfigurationError("a drain needs a consumer name (its stored offset is the watermark)")
    target = Target.of(stream, superstream)
    # Two drains of one consumer name would store each other's watermarks: hold the name's lease.
    with acquire_lease(
        conn,
        run_record.RUNS_STREAM,
        run_record.run_key(consumer, target.name),
        wait_s=DEFAULT_LEASE_WAIT_S,
        what=f"consumer '{consumer}' on {target.describe()}",
    ) as lease:
        # A watermark run or `rmqs watermark set` of the name writes records, and so does the drain
        # once it stored: a lease lost under the drain and taken back proves nobody wrote one meanwhile.
        lease.mark(BrokerClient(conn).stored_offset(lease.name, run_record.RUNS_STREAM))
        return _drain(
            spark,
            conn,
            lease,
            target,
            consumer,
            checkpoint,
            output_path,
            output_format,
            output_options,
            source_options,
            timeout_s,
            pipeline,
            retry_count,
        )


def _drain(
    spark: SparkSession,
    conn: ConnectionOptions,
    lease: Lease,
    target: Target,
    consumer: str,
    checkpoint: str,
    output_path: str,
    output_format: str,
    output_options: Mapping[str, str] | None,
    source_options: Mapping[str, str] | None,
    timeout_s: float,
    pipeline: str | None,
    retry_count: int,
) -> RunSummary:
    t0 = time.monotonic()
    opts = conn.to_options()
    opts[_SOURCE(target.kind)] = target.name
    opts.update(
        {
            _SOURCE("consumer_name"): consumer,
            _SOURCE("server_side_offset_tracking"): "true",
            **dict(source_options or {}),
        }
    )
    parsed = parse_source_options(opts, streaming=True)  # bad options: refused before reading
    strict = parsed.fail_on_data_loss
    check_sink_log_is_this_querys(checkpoint, output_path)
    client = BrokerClient(conn)
    recorded = checkpoint_streams.check_and_record(conn, checkpoint, target.streams(client))
    before = watermarks(conn, consumer, **target.kw())
    planned = None
    if drain_start.is_new(recorded.where if recorded is not None else None):
        planned = drain_start.planned_start(conn, lease, target, consumer, parsed)
    if planned is not None:  # the new checkpoint starts where a watermark run of the consumer would
        opts[_SOURCE("starting_offsets")] = drain_start.starting_offsets_option(planned.start)
    # The query's thread inherits this thread's local properties when it starts: its tasks report.
    with ExecutorReadMetrics(spark) as metrics:
        q = (
            spark.readStream.format("rabbitmq_streams")
            .options(**opts)
            .load()
            .writeStream.format(output_format)
            .options(**dict(output_options or {}))
            .option("path", output_path)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    if not q.awaitTermination(int(timeout_s)):
        q.stop()
        raise TimeoutError(f"the AvailableNow drain of '{target.name}' did not finish in {timeout_s:.0f} s")
    if q.exception() is not None:
        raise RuntimeError(f"the drain query failed: {q.exception()}")
    progress = [p for p in q.recentProgress if p.get("sources")]
    rows = sum(int(p.get("numInputRows") or 0) for p in progress)
    start = {p.stream: p.next_offset for p in before.partitions}
    start.update(planned.start if planned is not None else {})
    end = dict(start)
    if progress:
        end.update(_offsets(progress[-1]["sources"][0].get("endOffset")))
        start.update(_offsets(progress[0]["sources"][0].get("startOffset")) or {})
    last = {s: v - 1 for s, v in end.items() if v > start.get(s, 0)}
    lost: dict[str, list[int]] = {}
    if progress and not strict:  # the source skipped what retention removed: the summary says so
        read = _source_starts(before, planned, progress)
        ranges = {s: (read[s], stop) for s, stop in end.items() if s in read and stop > read[s]}
        lost = retention_during(conn, target.name, ranges)
    if planned is not None and planned.data_loss:
        lost = merge_spans(planned.data_loss, lost)
    checkpoint_streams.record(conn, recorded, target.streams(client))
    lease.keep("its final watermarks")  # the one store the drain makes itself (the source's: below)
    last = _never_backwards(conn, consumer, last, target)
    t_store = time.monotonic()
    if last:
        store_watermarks(conn, consumer, last)
        drain_start.record_end(conn, lease, target, consumer, start, end, before.stored_offsets(), pipeline)
    store_ms = _ms_since(t_store)
    after = watermarks(conn, consumer, **target.kw())
    summary = RunSummary(
        target.name,
        start,
        end,
        rows=rows,
        bytes=None,
        seconds=round(time.monotonic() - t0, 3),
        lag_after=after.total_lag,
        watermark_stored=bool(last),
        pipeline=pipeline,
        delivery="exactly_once",  # Spark's file sink commits each micro-batch with the checkpoint
        batches=len(progress),
        retry_count=retry_count,
        # Spark's own clocks: each batch's sink action (`addBatch`, which runs the executors' read
        # too, as run_read's flush_ms does), its offset and commit logs, then the final store.
        flush_ms=round(sum(_duration_ms(p, "addBatch") for p in progress), 3),
        commit_ms=round(sum(_duration_ms(p, "walCommit", "commitOffsets") for p in progress) + store_ms, 3),
    )
    if lost:
        summary.extra["data_loss"] = lost
    if progress:
        from pyspark_rmqs.runs.outputs.file_sink_log import written

        out = written(output_path, int(progress[0]["batchId"]), int(progress[-1]["batchId"]), output_format)
        if out is not None:
            summary.records_written, summary.bytes_written = out.rows, out.bytes
    metrics.fill(summary)
    return summary


def _source_starts(before: Watermarks, planned: ReadPlan | None, progress: list[Any]) -> dict[str, int]:
    """Where the query's source started each stream, before any clamp to the first offset: where the
    checkpoint was (the first batch's start offset), or for a new checkpoint where `drain_start`
    planned it (after the consumer's stored offset where it did not plan). What retention removed
    from there the source skipped with `failOnDataLoss=false`, as a watermark run's readers do
    (`steps.retention_during`): a drain that may have skipped rows never looks like a clean one."""
    start = {p.stream: p.first if p.stored is None else p.stored + 1 for p in before.partitions}
    start.update(planned.start if planned is not None else {})
    start.update(_offsets(progress[0]["sources"][0].get("startOffset")))
    return start


def _duration_ms(progress: Any, *phases: str) -> float:
    """The time Spark measured for `phases` of one micro-batch (its progress' `durationMs`)."""
    durations = progress.get("durationMs") or {}
    return sum(float(durations.get(phase, 0)) for phase in phases)


def _never_backwards(
    conn: ConnectionOptions, consumer: str, last: dict[str, int], target: Target
) -> dict[str, int]:
    """The watermarks of `last` that move forward: a lower one (another run got further) is not stored."""
    if not last:
        return last
    current = watermarks(conn, consumer, **target.kw()).stored_offsets()
    behind = {s: (current[s], v) for s, v in last.items() if (current.get(s) or -1) > v}
    if behind:
        log.warning(
            "consumer '%s' is already past this drain on %s (stored, drained): not moving it backwards",
            consumer,
            behind,
        )
    return {s: v for s, v in last.items() if s not in behind}


def _offsets(v: Any) -> dict[str, int]:
    if v is None:
        return {}
    if isinstance(v, str):
        v = json.loads(v)
    if not isinstance(v, Mapping):  # the first batch of a new query starts at "null"
        return {}
    return {str(k): int(x) for k, x in v.items()}
