"""Bounded reads without Spark: the watermark protocol (DESIGN §4) over Arrow batches.

`jobs.plan_read` fixes `[start, end)` per partition stream (and records a watermark run's plan in
the broker); `run_consume` reads exactly that range with `RangeReader`, one partition stream after
the other, hands each `pyarrow.RecordBatch` (the source schema) to a sink, and only after every
range reached the sink stores the new watermarks (`store_watermarks_checked`: never backwards).
A failure anywhere leaves the watermark alone and the plan pending: a retry reads the same rows.

Memory is bounded by `queueCapacity` and one batch, whatever the range: batches stream from the
reader to the sink and are never collected. Sinks:
- `FunctionSink(fn)`: `fn(batch)` for every batch (the Airflow operator's `apply_function`);
- `ParquetSink(output_path)`: one Parquet file per partition stream and range, named
  `<stream>-<start>-<end>-<run>.parquet` (`<run>`: the start of the run's token), complete or
  absent (renamed into place locally; an object store's upload completes whole), so a retry of
  the same range replaces the file instead of adding a duplicate; then the run's commit record,
  the manifest of its files, on a local folder and on an object store (`s3://`) alike.

Used by the Spark-free Airflow operator and by Dagster's `engine="arrow"`; imports no pyspark.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pyspark_rmqs.broker.positions import merge_spans
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.core.batches import BatchBuilder, value_bytes
from pyspark_rmqs.core.errors import CommitState, ConfigurationError, mark_commit_state
from pyspark_rmqs.options import ConnectionOptions, SourceOptions, parse_source_options
from pyspark_rmqs.runs.outputs.delivery import (
    FileCommits,
    RunToken,
    StoreCommits,
    covers,
    fsync_file,
    takes_token,
)
from pyspark_rmqs.runs.outputs.objectstore import locate, move_file
from pyspark_rmqs.runs.plan import ReadPlan, report_retry_loss
from pyspark_rmqs.runs.steps import finish_run, new_summary, skip_delivered
from pyspark_rmqs.runs.summary import RunSummary

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# Source options that mean something to a Spark-free bounded read (the rest plan or split Spark jobs).
READ_OPTIONS = tuple(
    SourceOptions.alias(field)
    for field in (
        "metadata_fields",
        "queue_capacity",
        "initial_credits",
        "poll_timeout_ms",
        "max_wait_ms",
        "filter_values",
        "filter_match_unfiltered",
        "strict_decoding",
    )
)


@runtime_checkable
class RangeSink(Protocol):
    """Receives the batches of one partition stream's range at a time."""

    def open(self, stream: str, start: int, end: int, schema: pa.Schema) -> None: ...

    def write(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> None:
        """The range is complete: make it visible (a file is renamed into place)."""

    def abort(self) -> None:
        """The range failed: leave nothing half-written behind."""


class FunctionSink:
    """Calls `fn(batch, *args, **kwargs)` for every batch (empty ranges call nothing)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def open(self, stream: str, start: int, end: int, schema: pa.Schema) -> None:
        pass

    def write(self, batch: pa.RecordBatch) -> None:
        self.fn(batch, *self.args, **self.kwargs)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def range_file_name(stream: str, start: int, end: int, token: RunToken | None = None) -> str:
    """`<stream>-<start>-<end>-<run>.parquet`: a run's range always has the same name.

    `<run>` is the start of the run's token (consumer, ranges, stream incarnations), so a retry of
    the run replaces its own file, while another consumer, or a stream deleted and created again,
    never overwrites it.
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stream)
    run = f"-{token.value[:12]}" if token is not None else ""
    return f"{safe}-{start}-{end}{run}.parquet"


class ParquetSink:
    """One Parquet file per partition stream and range under `output_path` (a directory or URI).

    Each file is written as `.<name>.<uuid>.tmp` (this try's own name) and moved to its final name
    when its range is complete: a rename on a local file system, a server-side copy on an object
    store (`s3://...`, through pyarrow or fsspec: `objectstore.py`), where an aborted writer's
    upload completes on close and must not land on a name another try of the run committed; a
    range that fails is deleted under its own name. Either way a retry of the range overwrites the
    same final name, and the run's commit record (`delivery.FileCommits` / `delivery.StoreCommits`,
    written by `run_consume` after every range) is the manifest readers trust (`committed.py`).
    `outputs` lists the files written (paths, or URIs on an object store).

    :param filesystem: a `pyarrow.fs.FileSystem` or an fsspec file system to write with.
    :param storage_options: instead, fsspec options for the URI's scheme (credentials, `endpoint_url`).
    """

    def __init__(
        self,
        output_path: str,
        *,
        compression: str = "snappy",
        skip_committed: bool = True,
        filesystem: Any = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.location = locate(output_path, filesystem=filesystem, storage_options=storage_options)
        self.fs, self.base = self.location.fs, self.location.base
        self.uri = self.location.uri
        self.compression = compression
        # Leave out offsets earlier runs of the consumer committed here (False: a run replaces the
        # folder whole, a Dagster time window).
        self.skip_committed = skip_committed
        self.outputs: list[str] = []
        self.written: list[str] = []  # the same files, relative to the folder (the commit record's)
        self._writer: Any = None
        self._tmp = self._final = ""
        self._token: RunToken | None = None

    def commits(self) -> FileCommits | StoreCommits:
        """Where the run's commit record goes: beside its files."""
        if self.location.local:
            return FileCommits(self.location.base)
        return StoreCommits(self.location)

    def begin_run(self, token: RunToken) -> None:
        """The run's token names its files (`range_file_name`)."""
        self._token = token

    def open(self, stream: str, start: int, end: int, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        name = range_file_name(stream, start, end, self._token)
        self._final = self.location.path(name)
        if self.location.local:
            self.fs.create_dir(self.base, recursive=True)
        # This try's own name until the range is complete, on an object store too: another try of
        # the same run (the same token, so the same final name) may have committed the final name,
        # and closing an aborted writer completes its upload (pyarrow cannot abandon one), which
        # would replace that committed object with a partial one. The move is a server-side copy
        # there; a dot name is skipped by folder scans (pyarrow, Spark, DuckDB globs).
        self._tmp = self.location.path(f".{name}.{uuid.uuid4().hex[:8]}.tmp")
        self._writer = pq.ParquetWriter(self._tmp, schema, filesystem=self.fs, compression=self.compression)

    def write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)

    def close(self) -> None:
        self._writer.close()
        self._writer = None
        if self.location.local:
            fsync_file(Path(self._tmp))  # on disk before the commit record names it
        move_file(self.fs, self._tmp, self._final)
        rel = self.location.relative(self._final)
        self.written.append(rel)
        self.outputs.append(self._final if self.location.local else self.location.uri_of(rel))
        # The range is complete: nothing of it is this sink's to remove any more (an abort after it
        # once removed the last closed name, which on an object store was a final name another try
        # of the run had committed).
        self._tmp = self._final = ""

    def abort(self) -> None:
        """Remove what the range being written left (nothing once its `close` completed)."""
        if not self._tmp:
            return
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:
                log.debug("closing the aborted Parquet writer failed", exc_info=True)
            self._writer = None
        try:  # closing completed the partial file under this try's own name: remove it
            self.fs.delete_file(self._tmp)
        except Exception:
            log.debug("removing %s failed", self._tmp, exc_info=True)
        self._tmp = self._final = ""


def read_settings(
    conn: ConnectionOptions,
    plan: ReadPlan,
    *,
    metadata_fields: str | None = None,
    source_options: Mapping[str, str] | None = None,
) -> ReadSettings:
    """Reader settings from source options, parsed and checked as Spark's source parses them."""
    opts = dict(source_options or {})
    unknown = sorted(k for k in opts if k.lower() not in {o.lower() for o in READ_OPTIONS})
    if unknown:
        raise ConfigurationError(
            f"source option(s) {unknown} do not apply to a Spark-free read; valid: {', '.join(READ_OPTIONS)}"
        )
    if metadata_fields is not None:
        opts[SourceOptions.alias("metadata_fields")] = metadata_fields
    target = SourceOptions.alias("superstream" if plan.superstream else "stream")
    parsed = parse_source_options(
        {**conn.to_options(), target: plan.target, **opts},
        streaming=False,
    )
    return ReadSettings(**{**parsed.reader_settings(), "fail_on_data_loss": plan.fail_on_data_loss})


def run_consume(
    conn: ConnectionOptions,
    plan: ReadPlan,
    sink: RangeSink | Callable[[pa.RecordBatch], Any],
    *,
    store_watermark: bool = True,
    metadata_fields: str | None = None,
    source_options: Mapping[str, str] | None = None,
    settings: ReadSettings | None = None,
    pipeline: str | None = None,
    retry_count: int = 0,
) -> RunSummary:
    """Read `plan` into `sink` without Spark; then, and only then, store `plan.consumer`'s watermarks.

    The summary is `jobs.RunSummary` (as `jobs.run_read` returns it) plus `rows_per_stream`, the
    `files` a file sink wrote, and `data_loss` (offsets retention removed, failOnDataLoss=false).
    A `ParquetSink` commits the run under its range token (`delivery.py`): a retry of a committed
    range reads and writes nothing again and only stores the watermark. A function taking `token=`
    receives the run's `RunToken` with every batch.
    """
    try:
        return _run_consume(
            conn,
            plan,
            sink,
            store_watermark,
            metadata_fields,
            source_options,
            settings,
            pipeline,
            retry_count,
        )
    finally:
        plan.release()


def _run_consume(
    conn: ConnectionOptions,
    plan: ReadPlan,
    sink: RangeSink | Callable[[pa.RecordBatch], Any],
    store_watermark: bool,
    metadata_fields: str | None,
    source_options: Mapping[str, str] | None,
    settings: ReadSettings | None,
    pipeline: str | None,
    retry_count: int,
) -> RunSummary:
    t0 = time.monotonic()
    token = plan.token
    target: RangeSink = sink if isinstance(sink, RangeSink) else FunctionSink(sink)
    if isinstance(target, FunctionSink) and takes_token(target.fn):
        target.kwargs = {**target.kwargs, "token": token}
    s = settings or read_settings(conn, plan, metadata_fields=metadata_fields, source_options=source_options)
    commits = target.commits() if isinstance(target, ParquetSink) else None
    committed_run = getattr(target, "committed", None)  # a sink keeping its own commits (Iceberg)
    exactly_once = commits is not None or committed_run is not None
    summary = new_summary(plan, token, pipeline, retry_count, exactly_once=exactly_once)
    per_stream: dict[str, int] = {}
    lost: dict[str, list[int]] = {}
    record = commits.record(token) if commits is not None and not plan.is_empty else None
    # Ranges earlier runs of the consumer committed to the output (Parquet commits, or the sink's own:
    # Iceberg's snapshots), recognised per partition range: only the rest is written.
    spans_of = commits.committed_spans if commits is not None else getattr(target, "committed_spans", None)
    skip = spans_of is not None and record is None and getattr(target, "skip_committed", True)
    done = spans_of(token) if skip and spans_of is not None else {}
    if done:  # earlier runs of this consumer committed part of the range here: only the rest is written
        log.info("the output already holds %s of consumer '%s': not written again", done, plan.consumer)
        summary.extra["already_committed"] = {st: [list(x) for x in v] for st, v in done.items()}
    if record is None and plan.delivered:
        skip_delivered(plan, summary)
    elif record is None and committed_run is not None and not plan.is_empty and committed_run(token):
        log.info("range %s is already in %s (token %s): not written again", plan.ranges, target, token.value)
        summary.rows = summary.bytes = None
        summary.extra["sink_skipped"] = True
    elif record is not None:
        log.info("range %s was committed by an earlier attempt: not read or written again", plan.ranges)
        summary.rows, summary.bytes = record.rows, record.bytes
        summary.extra["sink_skipped"] = True
        summary.extra["files"] = [commits.path_of(f) for f in record.files] if commits else []
    else:
        try:
            if hasattr(target, "begin_run"):
                target.begin_run(token)
            if covers(done, plan.ranges):
                summary.extra["sink_skipped"] = True
            else:  # read again: what retention took from a resumed range since is lost now
                report_retry_loss(plan, done)
                _consume(conn, plan, target, s, summary, per_stream, lost, done)
        except BaseException as e:
            raise mark_commit_state(e, CommitState.BEFORE) from None
        if hasattr(target, "commit_run"):
            t_commit = time.monotonic()
            try:
                _fence(plan)
                target.commit_run()
            except BaseException as e:
                raise mark_commit_state(e, CommitState.UNKNOWN) from None
            summary.commit_ms = round((time.monotonic() - t_commit) * 1000, 3)
        if commits is not None and not plan.is_empty:
            t_commit = time.monotonic()
            try:
                _fence(plan)
                files = list(getattr(target, "written", []))
                commits.commit(token, files, summary.rows, summary.bytes)
            except BaseException as e:
                raise mark_commit_state(e, CommitState.UNKNOWN) from None
            summary.commit_ms = round((time.monotonic() - t_commit) * 1000, 3)
    summary.extra["rows_per_stream"] = per_stream
    outputs = getattr(target, "outputs", None)
    if outputs is not None and "sink_skipped" not in summary.extra:
        summary.extra["files"] = list(outputs)
    if not plan.fail_on_data_loss:
        summary.extra["data_loss"] = merge_spans(plan.data_loss, lost)
    return finish_run(conn, plan, summary, t0, store_watermark=store_watermark)


def _fence(plan: ReadPlan) -> None:
    """No commit after another run took the name over (`Lease.fence`: one round trip)."""
    if plan.lease is not None:
        try:
            plan.lease.fence("its output's commit")
        except BaseException as e:
            raise mark_commit_state(e, CommitState.BEFORE) from None


def _without(batch: pa.RecordBatch, spans: list[tuple[int, int]]) -> pa.RecordBatch:
    """`batch` without the rows whose offset lies in one of `spans`."""
    import pyarrow.compute as pc

    offsets = batch.column("offset")
    inside = None
    for a, b in spans:
        hit = pc.and_(pc.greater_equal(offsets, a), pc.less(offsets, b))
        inside = hit if inside is None else pc.or_(inside, hit)
    return batch if inside is None else batch.filter(pc.invert(inside))


def _consume(
    conn: ConnectionOptions,
    plan: ReadPlan,
    target: RangeSink,
    s: ReadSettings,
    summary: RunSummary,
    per_stream: dict[str, int],
    lost: dict[str, list[int]],
    exclude: Mapping[str, list[tuple[int, int]]],
) -> None:
    """Every range of `plan` through `target`, measuring fetch and decode (reader) and flush (sink) time.

    Offsets in `exclude` (already committed in the output) are dropped from the batches. A lease
    that ended under the run is kept before every batch (`Lease.keep`: taken back when nobody took
    the name over, else `LeaseLostError`): no batch reaches the sink once another run may be
    delivering the same range, unless this process has not yet seen its lease end."""
    fetch = decode = flush = 0.0
    batches = 0
    lease = plan.lease
    for stream, (start, end) in plan.ranges.items():
        reader = RangeReader(conn, stream, start, end, s)
        target.open(stream, start, end, BatchBuilder(stream, s.metadata_fields).schema)
        rows = 0
        try:
            try:
                for batch in reader:
                    if lease is not None:  # a lease that ended under the sink stops it here
                        lease.keep(f"more of {stream} to its sink")
                    if stream in exclude:
                        batch = _without(batch, exclude[stream])
                    t = time.perf_counter()
                    target.write(batch)
                    flush += time.perf_counter() - t
                    batches += 1
                    rows += batch.num_rows
                    summary.bytes = (summary.bytes or 0) + value_bytes(batch)
            finally:  # the reader's own clocks: waiting for and receiving chunks, and decoding them
                fetch += reader.fetch_s
                decode += reader.decode_s
            t = time.perf_counter()
            target.close()
            flush += time.perf_counter() - t
        except BaseException:
            target.abort()
            raise
        per_stream[stream] = rows
        summary.rows = (summary.rows or 0) + rows
        if reader.lost:
            lost[stream] = [min(lo for lo, _ in reader.lost), max(hi for _, hi in reader.lost)]
    summary.records_written = summary.rows
    summary.batches = batches
    summary.fetch_ms = round(fetch * 1000, 3)
    summary.decode_ms = round(decode * 1000, 3)
    summary.flush_ms = round(flush * 1000, 3)
