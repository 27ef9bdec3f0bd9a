"""Bounded reads and AvailableNow drains under the watermark protocol (DESIGN §4).

Shared by the Airflow operators and the Dagster assets, so both behave alike:

1. `plan_read` fixes the range per partition stream before anything is read: start from the
   watermark (the consumer's stored offset + 1), an offset, a timestamp or earliest/latest; end at
   the tails as they are now (or offsets / a timestamp); `max_messages` caps it proportionally.
   A watermark run records its plan in the broker (`watermarks.record_plan`) before reading, and a
   run that finds a pending plan (an earlier try failed after planning) reads exactly that range
   again, whatever arrived since: any retry, on any worker, reads the same rows.
2. `run_read` reads exactly that range with Spark, hands the DataFrame to the sink, and only after
   the sink returned stores the new watermarks (`end - 1`), unless another run moved them since
   this one planned (`WatermarkConflictError`: a watermark never moves backwards). Any failure
   before that leaves the watermark alone and the plan pending: at-least-once, same rows.
3. `run_drain` does the same with a Structured Streaming query and `Trigger.AvailableNow`.

pyspark is imported only inside the Spark-running functions: planning is metadata only.

One module on purpose, although above ~500 lines: `plan_read`, `run_read`, `run_drain` and
`finish_run` are the steps of one protocol, and the order in which a run plans, reads, hands the
rows to the sink, commits its output and stores the watermark is the delivery guarantee, so a
change to one step is checked against the others here, in one read. `consume.py` (the Spark-free
run) reuses these steps instead of copying them. The parts that could move out without touching
that order are the Spark session and reader-option helpers and the run metrics (`RunSummary`
and how they are measured).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark_rmqs import offsets as off
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.delivery import FileCommits, RunToken, check_delivery, takes_token
from pyspark_rmqs.errors import (
    CommitState,
    ConfigurationError,
    lost_message,
    mark_commit_state,
    report_data_loss,
)
from pyspark_rmqs.options import ConnectionOptions, SourceOptions
from pyspark_rmqs.planning import Bounds, Position, merge_spans, resolve_positions, timestamp_start_loss
from pyspark_rmqs.target import Target
from pyspark_rmqs.watermarks import (
    pending_plan,
    record_plan,
    store_watermarks,
    store_watermarks_checked,
    watermarks,
    watermarks_after,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
_SOURCE = SourceOptions.alias  # option names users type, from the option table


@dataclass(frozen=True)
class ReadPlan:
    """What one run reads: `[start, end)` per partition stream, fixed before reading."""

    target: str
    superstream: bool
    consumer: str | None
    start: dict[str, int]
    end: dict[str, int]
    # The consumer's stored offsets when the run planned: storing checks nobody moved them since.
    seen: dict[str, int | None] = field(default_factory=dict)
    # True when this run re-reads a pending plan that an earlier, failed try recorded.
    resumed: bool = False
    # Carried into the executors: a gap found while reading fails the run or is skipped and logged.
    fail_on_data_loss: bool = True
    # Offsets found lost while planning and skipped (failOnDataLoss=false): the summary's `data_loss`.
    data_loss: dict[str, list[int]] = field(default_factory=dict)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        return {s: (self.start[s], self.end[s]) for s in self.start if self.end[s] > self.start[s]}

    @property
    def is_empty(self) -> bool:
        return not self.ranges

    @property
    def stream_target(self) -> Target:
        """The stream or super stream planned, as the one `Target` value."""
        return Target(self.target, self.superstream)

    @property
    def offsets_span(self) -> int:
        """Offsets covered (an upper bound on rows: offset-tracking entries take offsets too)."""
        return sum(e - s for s, e in self.ranges.values())


@dataclass
class RunSummary:
    """What a run did; JSON-friendly (XCom, Dagster metadata). No connection details, no secrets.

    The standard run metrics are measured where the run can measure them and None where it cannot:
    never estimated. `fetch_ms` and `decode_ms` are the readers' own clocks (`RangeReader.fetch_s`
    and `decode_s`); in a Spark run they are summed over its tasks (brought back by an accumulator,
    `ReadMetrics`), so a read of several partitions in parallel can exceed the wall time, as Spark's
    own task times do; None with Spark Connect, which has no accumulators. `rows` and `bytes` are
    kept as the names earlier releases used for `records_read` and `bytes_read`.
    """

    target: str
    start_offsets: dict[str, int]
    end_offsets: dict[str, int]
    rows: int | None = None
    bytes: int | None = None
    seconds: float = 0.0
    lag_after: int | None = None
    watermark_stored: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pipeline: str | None = None  # the DAG/task or asset key that ran it
    token: str | None = None  # the run's range token (exactly-once commits)
    delivery: str = "at_least_once"
    records_written: int | None = None
    bytes_written: int | None = None
    batches: int | None = None
    retry_count: int = 0
    fetch_ms: float | None = None
    decode_ms: float | None = None
    flush_ms: float | None = None
    commit_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def records_read(self) -> int | None:
        return self.rows

    @property
    def bytes_read(self) -> int | None:
        return self.bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        d["records_read"], d["bytes_read"] = self.rows, self.bytes
        return d


def plan_read(
    conn: ConnectionOptions,
    *,
    stream: str | None = None,
    superstream: str | None = None,
    consumer: str | None = None,
    start: Position = "watermark",
    end: Position = "latest",
    max_messages: int | None = None,
    starting_offsets: str = "earliest",
    fail_on_data_loss: bool = True,
    persist: bool = True,
) -> ReadPlan:
    """Fix `[start, end)` per partition stream now (tails as of this call), metadata only.

    With `start="watermark"` and `persist` (a run that will store the watermark), a pending plan
    is read again as it was recorded, and a new plan is recorded in the broker before returning.
    Backfills (explicit starts, `persist=False`) neither read nor touch the recorded plan.
    """
    if starting_offsets not in ("earliest", "latest"):
        raise ConfigurationError(f"starting_offsets must be 'earliest' or 'latest'; got {starting_offsets!r}")
    if max_messages is not None and max_messages < 1:
        raise ConfigurationError(f"max_messages must be at least 1; got {max_messages}")
    w = watermarks(conn, consumer or "", stream=stream, superstream=superstream)
    seen = w.stored_offsets()
    watermark_run = bool(consumer) and persist and isinstance(start, str) and start == "watermark"
    pending = pending_plan(conn, w) if watermark_run else {}
    lost: dict[str, list[int]] = {}
    if pending:
        starts = {p.stream: pending.get(p.stream, (p.next_offset, 0))[0] for p in w.partitions}
        ends = {p.stream: pending.get(p.stream, (0, p.next_offset))[1] for p in w.partitions}
        log.info("consumer '%s' has a pending plan %s: reading exactly that range again", consumer, pending)
    else:
        client = BrokerClient(conn)
        b = Bounds({p.stream: p.first for p in w.partitions}, {p.stream: p.tail for p in w.partitions})
        stored = seen if consumer else None
        starts = resolve_positions(client, b, start, is_end=False, stored=stored, fallback=starting_offsets)
        lost = timestamp_start_loss(client, b, start, fail_on_data_loss)
        ends = resolve_positions(client, b, end, is_end=True)
    for p in w.partitions:
        s = p.stream
        if starts[s] < p.first and ends[s] > starts[s]:
            report_data_loss(
                fail_on_data_loss,
                lost_message(s, starts[s], min(p.first, ends[s]), "retention removed them before this run"),
            )
        starts[s] = max(starts[s], p.first)
        ends[s] = max(starts[s], min(ends[s], p.tail))
    if max_messages is not None and not pending:
        ends = off.apply_limit(starts, ends, max_messages)
    plan = ReadPlan(
        w.target, w.superstream, consumer, starts, ends, seen, bool(pending), fail_on_data_loss, lost
    )
    if watermark_run and not pending and consumer:
        record_plan(conn, consumer, plan.ranges)
    return plan


# --------------------------------------------------------------------------------------- Spark


def spark_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    remote: str | None = None,
    app: str = "rmqs",
) -> SparkSession:
    """A local SparkSession (PYSPARK_PYTHON = this interpreter), or Spark Connect with `remote`."""
    import os

    from pyspark.sql import SparkSession

    if remote:
        builder = SparkSession.builder.remote(remote).appName(app)
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            SparkSession.builder.master(master or "local[2]")
            .appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
        )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def read_options(conn: ConnectionOptions, plan: ReadPlan, **extra: str) -> dict[str, str]:
    """Spark source options reading exactly `plan` (secrets included: hand them to Spark only)."""
    opts = conn.to_options()
    opts[_SOURCE("superstream" if plan.superstream else "stream")] = plan.target
    opts[_SOURCE("starting_offsets")] = off.offsets_to_json(plan.start)
    opts[_SOURCE("ending_offsets")] = off.offsets_to_json(plan.end)
    opts[_SOURCE("fail_on_data_loss")] = "true" if plan.fail_on_data_loss else "false"
    opts.update(extra)
    return opts


def read_dataframe(spark: SparkSession, conn: ConnectionOptions, plan: ReadPlan, **extra: str) -> DataFrame:
    return spark.read.format("rabbitmq_streams").options(**read_options(conn, plan, **extra)).load()


@dataclass(frozen=True)
class FileOutput:
    """A file sink rmqs writes (`df.write.format(fmt)...save(path)`), exactly-once by default.

    With `delivery="exactly_once"` (and `mode="append"`) a run's files are staged, published and
    committed under its range token (`delivery.py`): a retry of a committed range writes nothing
    again. `delivery="at_least_once"` (or `mode="overwrite"`) writes straight to `path`.
    """

    path: str
    fmt: str = "parquet"
    mode: str = "append"
    options: Mapping[str, str] | None = None
    partition_by: list[str] | None = None
    delivery: str = "exactly_once"

    @property
    def exactly_once(self) -> bool:
        return self.delivery == "exactly_once" and self.mode == "append"

    def write_to(self, df: DataFrame, path: str, mode: str) -> None:
        w = df.write.format(self.fmt).mode(mode).options(**dict(self.options or {}))
        if self.partition_by:
            w = w.partitionBy(*self.partition_by)
        w.save(path)

    def __call__(self, df: DataFrame) -> None:
        self.write_to(df, self.path, self.mode)


def write_output(
    path: str,
    fmt: str = "parquet",
    mode: str = "append",
    options: Mapping[str, str] | None = None,
    partition_by: list[str] | None = None,
    delivery: str = "exactly_once",
) -> FileOutput:
    """A sink writing the DataFrame to files; exactly-once per range unless `delivery="at_least_once"`."""
    return FileOutput(path, fmt, mode, options, partition_by, check_delivery(delivery))


def observe_counts(df: DataFrame) -> tuple[DataFrame, Any]:
    """`df` observed for its row count and body bytes (read back with `observed_counts` after the
    sink's action): a run's and a publish's `rows` / `bytes`, with no extra Spark job."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    obs = Observation("rmqs_run")
    observed = df.observe(
        obs, F.count(F.lit(1)).alias("rows"), F.coalesce(F.sum(F.length("value")), F.lit(0)).alias("bytes")
    )
    return observed, obs


def observed_counts(obs: Any) -> dict[str, int] | None:
    """The observed row and byte counts, when the sink ran an action on the DataFrame."""
    jo = getattr(obs, "_jo", None)
    try:
        if jo is not None and not jo.future().isCompleted():
            return None
        return {k: int(v) for k, v in obs.get.items()}
    except Exception:  # Spark Connect or no action: counts unknown, not an error
        return None


def run_read(
    spark: SparkSession,
    conn: ConnectionOptions,
    plan: ReadPlan,
    sink: Callable[..., Any],
    *,
    store_watermark: bool = True,
    metadata_fields: str | None = None,
    pipeline: str | None = None,
    retry_count: int = 0,
) -> RunSummary:
    """Read `plan` into `sink`; then, and only then, store the watermarks of `plan.consumer`.

    A `FileOutput` sink with exactly-once delivery is committed under the run's token before the
    watermark is stored (`delivery.py`); any other sink is called with the DataFrame, and with
    `token=` too when it takes that keyword (so it can make its own writes idempotent). A failure
    carries its `commit_state` (`errors.CommitState`).
    """
    t0 = time.monotonic()
    token = RunToken(plan.consumer, plan.ranges)
    exactly_once = isinstance(sink, FileOutput) and sink.exactly_once
    summary = new_summary(plan, token, pipeline, retry_count, exactly_once=exactly_once)
    if not plan.is_empty:
        extra = {} if metadata_fields is None else {_SOURCE("metadata_fields"): metadata_fields}
        if exactly_once:
            assert isinstance(sink, FileOutput)
            _commit_files(spark, conn, plan, sink, token, summary, extra)
        else:
            try:
                obs = _read_into(spark, conn, plan, extra, summary, lambda df: _call_sink(sink, df, token))
            except BaseException as e:
                raise mark_commit_state(e, CommitState.BEFORE) from None
            _count_read(summary, obs)
        if not plan.fail_on_data_loss:
            summary.extra["data_loss"] = merge_spans(plan.data_loss, _retention_during(conn, plan))
    elif plan.data_loss:  # nothing left to read: what planning found lost and skipped
        summary.extra["data_loss"] = dict(plan.data_loss)
    return finish_run(conn, plan, summary, t0, store_watermark=store_watermark)


def new_summary(
    plan: ReadPlan, token: RunToken, pipeline: str | None, retry_count: int, *, exactly_once: bool
) -> RunSummary:
    """The summary a run fills in: its range, identity, token and delivery (Spark and Spark-free runs)."""
    summary = RunSummary(plan.target, dict(plan.start), dict(plan.end), rows=0, bytes=0, records_written=0)
    summary.pipeline, summary.retry_count, summary.token = pipeline, retry_count, token.value
    summary.delivery = "exactly_once" if exactly_once else "at_least_once"
    return summary


def finish_run(
    conn: ConnectionOptions, plan: ReadPlan, summary: RunSummary, started: float, *, store_watermark: bool
) -> RunSummary:
    """The end of every run once its sink succeeded: store the watermark, then report.

    The store is checked against concurrent runs; a failure there is marked `COMMITTED` when the
    run's output was committed (exactly-once), so a retry only stores. Then the lag after the run,
    the time taken, and one structured log line with the whole summary.
    """
    if store_watermark and plan.consumer and not plan.is_empty:
        t_store = time.monotonic()
        try:
            store_watermarks_checked(conn, plan.consumer, watermarks_after(plan.ranges), plan.seen)
        except BaseException as e:
            if summary.delivery == "exactly_once":
                mark_commit_state(e, CommitState.COMMITTED)
            raise
        summary.commit_ms = round((summary.commit_ms or 0.0) + _ms_since(t_store), 3)
        summary.watermark_stored = True
    if plan.resumed:
        summary.extra["resumed_plan"] = True
    if plan.consumer:
        summary.lag_after = watermarks(conn, plan.consumer, **plan.stream_target.kw()).total_lag
    summary.seconds = round(time.monotonic() - started, 3)
    log.info("rmqs run on '%s': %s", plan.target, json.dumps(summary.to_dict(), default=str))
    return summary


def _commit_files(
    spark: SparkSession,
    conn: ConnectionOptions,
    plan: ReadPlan,
    sink: FileOutput,
    token: RunToken,
    summary: RunSummary,
    extra: Mapping[str, str],
) -> None:
    """Stage, publish and commit the run's files under its token; skip what an earlier attempt committed."""
    commits = FileCommits(sink.path)
    record = commits.record(token)
    if record is not None:
        log.info(
            "range %s was committed by an earlier attempt (%s): not written again", plan.ranges, token.value
        )
        summary.rows, summary.bytes, summary.records_written = record.rows, record.bytes, 0
        summary.extra["sink_skipped"] = True
        return
    try:
        files = commits.published_files(token)  # published, then the attempt died before its record
        if files is None:
            stage = commits.begin(token)
            obs = _read_into(
                spark, conn, plan, extra, summary, lambda df: sink.write_to(df, str(stage), "overwrite")
            )
            _count_read(summary, obs)
            files = commits.publish(token)
        else:
            summary.rows = summary.bytes = summary.records_written = None
    except BaseException as e:
        raise mark_commit_state(e, CommitState.BEFORE) from None
    t_commit = time.monotonic()
    try:
        commits.commit(token, files, summary.rows, summary.bytes)
    except BaseException as e:
        raise mark_commit_state(e, CommitState.UNKNOWN) from None
    summary.commit_ms = _ms_since(t_commit)
    summary.bytes_written = sum((commits.root / f).stat().st_size for f in files)
    summary.extra["files"] = len(files)


def _read_into(
    spark: SparkSession,
    conn: ConnectionOptions,
    plan: ReadPlan,
    extra: Mapping[str, str],
    summary: RunSummary,
    write: Callable[[DataFrame], Any],
) -> Any:
    """Read `plan` once into `write` (one Spark action), measured: the sink's time (`flush_ms`) and
    the executors' fetch and decode time; returns the observation of its rows and bytes
    (`_count_read`), which holds once the action ran."""
    with ExecutorReadMetrics(spark) as metrics:
        df, obs = observe_counts(read_dataframe(spark, conn, plan, **extra))
        t_sink = time.monotonic()
        write(df)
        summary.flush_ms = _ms_since(t_sink)
    metrics.fill(summary)
    return obs


def _count_read(summary: RunSummary, obs: Any) -> None:
    """A one-action read's counts: the rows and bytes observed, all of them written, in one batch."""
    _count(summary, observed_counts(obs))
    summary.records_written = summary.rows
    summary.batches = 1


class ExecutorReadMetrics:
    """The fetch and decode time the executors' readers measure during the Spark jobs of a block.

    Enter it before the DataFrame is made (the plan binds the data source then). Sets the local
    property `spark.common.METRICS_PROPERTY` (inherited by the jobs this thread starts, a streaming
    query's included) to a fresh accumulator of `ReadMetrics` and restores the
    previous value on exit; `fill` copies the sums into a summary once Spark sent the tasks' results
    back. Nothing is filled when no reader reported (Spark Connect, no accumulators; a sink that
    never read the DataFrame; a job started from another thread). The source is registered in the
    session first (`spark.common.register_for_metrics`): Spark passes no accumulator to a data
    source it found by itself.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.acc: Any = None
        self._sc: Any = None
        self._previous: str | None = None

    def __enter__(self) -> ExecutorReadMetrics:
        from pyspark_rmqs.spark.common import METRICS_PROPERTY, ReadMetrics, register_for_metrics

        try:
            sc = self.spark.sparkContext
        except Exception:  # Spark Connect: no SparkContext, no accumulators
            return self
        try:
            register_for_metrics(self.spark)
        except Exception:  # the read still works, through the source Spark found itself
            log.debug("registering rabbitmq_streams for run metrics failed", exc_info=True)
            return self
        self._sc, self.acc = sc, sc.accumulator({}, ReadMetrics())
        self._previous = sc.getLocalProperty(METRICS_PROPERTY)
        sc.setLocalProperty(METRICS_PROPERTY, str(self.acc.aid))
        return self

    def __exit__(self, *exc: object) -> None:
        from pyspark_rmqs.spark.common import METRICS_PROPERTY

        if self._sc is not None:
            self._sc.setLocalProperty(METRICS_PROPERTY, self._previous)  # None removes it

    @property
    def values(self) -> dict[str, float]:
        return dict(self.acc.value) if self.acc is not None else {}

    def fill(self, summary: RunSummary) -> None:
        v = self.values
        if v.get("readers"):
            summary.fetch_ms = round(v.get("fetch_ms", 0.0), 3)
            summary.decode_ms = round(v.get("decode_ms", 0.0), 3)
            if summary.bytes is None and "bytes" in v:
                summary.bytes = int(v["bytes"])  # message bodies the tasks read


def _call_sink(sink: Callable[..., Any], df: DataFrame, token: RunToken) -> Any:
    """`sink(df, token=...)` when the sink takes a `token` keyword, else `sink(df)`."""
    return sink(df, token=token) if takes_token(sink) else sink(df)


def _count(summary: RunSummary, counts: dict[str, int] | None) -> None:
    summary.rows = counts["rows"] if counts else None
    summary.bytes = counts["bytes"] if counts else None


def _ms_since(t: float) -> float:
    return round((time.monotonic() - t) * 1000, 3)


def _retention_during(conn: ConnectionOptions, plan: ReadPlan) -> dict[str, list[int]]:
    """Per stream, the part of the range retention removed by the end of the read: `[start, first)`.

    With `failOnDataLoss=false` the executors skip (and log, with exact offsets) what retention
    removed before they read it; offsets of this span they read earlier are in the output. The
    summary names the span so a run that may have lost rows never looks like a clean one.
    """
    firsts = BrokerClient(conn).bounds(plan.ranges)
    out: dict[str, list[int]] = {}
    for s, (start, end) in plan.ranges.items():
        found = firsts.get(s)
        first = end if found is None else found[0]  # a deleted stream: the whole range
        if first > start:
            out[s] = [start, min(first, end)]
    if out:
        log.warning(
            "rmqs run on '%s': retention removed %s during the read (failOnDataLoss=false)", plan.target, out
        )
    return out


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
    """
    if not consumer:
        raise ConfigurationError("a drain needs a consumer name (its stored offset is the watermark)")
    t0 = time.monotonic()
    target = Target.of(stream, superstream)
    opts = conn.to_options()
    opts[_SOURCE(target.kind)] = target.name
    opts.update(
        {
            _SOURCE("consumer_name"): consumer,
            _SOURCE("server_side_offset_tracking"): "true",
            **dict(source_options or {}),
        }
    )
    before = watermarks(conn, consumer, **target.kw())
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
    end = dict(start)
    if progress:
        end.update(_offsets(progress[-1]["sources"][0].get("endOffset")))
        start.update(_offsets(progress[0]["sources"][0].get("startOffset")) or {})
    last = {s: v - 1 for s, v in end.items() if v > start.get(s, 0)}
    last = _never_backwards(conn, consumer, last, target)
    t_store = time.monotonic()
    if last:
        store_watermarks(conn, consumer, last)
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
    if progress:
        from pyspark_rmqs.spark.file_sink_log import written

        out = written(output_path, int(progress[0]["batchId"]), int(progress[-1]["batchId"]), output_format)
        if out is not None:
            summary.records_written, summary.bytes_written = out.rows, out.bytes
    metrics.fill(summary)
    return summary


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
