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
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark_rmqs import offsets as off
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.delivery import FileCommits, RunToken, check_delivery, covers, takes_token
from pyspark_rmqs.errors import (
    CommitState,
    ConfigurationError,
    lost_message,
    mark_commit_state,
    report_data_loss,
)
from pyspark_rmqs.options import ConnectionOptions, SourceOptions
from pyspark_rmqs.planning import Bounds, Position, merge_spans, resolve_positions, timestamp_start_loss
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.incarnation import incarnations as incarnations_of
from pyspark_rmqs.runs.incarnation import same as same_incarnation
from pyspark_rmqs.runs.lease import DEFAULT_WAIT_S as DEFAULT_LEASE_WAIT_S
from pyspark_rmqs.runs.lease import Lease
from pyspark_rmqs.runs.lease import acquire as acquire_lease
from pyspark_rmqs.runs.record import RunRecord
from pyspark_rmqs.target import Target
from pyspark_rmqs.watermarks import (
    Watermarks,
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
    """What one run reads: `[start, end)` per partition stream, fixed before reading.

    A run that stores its consumer's watermark also carries its run record (`runs.record`) and
    holds the consumer's lease (`runs.lease`) until it ends (`release`).
    """

    target: str
    superstream: bool
    consumer: str | None
    start: dict[str, int]
    end: dict[str, int]
    # The consumer's stored offsets when the run planned: storing checks nobody moved them since.
    seen: dict[str, int | None] = field(default_factory=dict)
    # True when this run resumes the record of an earlier, failed try (the same ranges and token).
    resumed: bool = False
    # Carried into the executors: a gap found while reading fails the run or is skipped and logged.
    fail_on_data_loss: bool = True
    # Each partition stream's incarnation (`runs.incarnation`): part of the token.
    incarnations: dict[str, int] = field(default_factory=dict)
    # The run record of a run that stores its watermark (None: a backfill, which stores nothing).
    record: RunRecord | None = field(default=None, compare=False)
    lease: Lease | None = field(default=None, compare=False, repr=False)
    # Offsets found lost while planning and skipped (failOnDataLoss=false): the summary's `data_loss`.
    data_loss: dict[str, list[int]] = field(default_factory=dict)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        return {s: (self.start[s], self.end[s]) for s in self.start if self.end[s] > self.start[s]}

    @property
    def is_empty(self) -> bool:
        return not self.ranges

    @property
    def stores(self) -> bool:
        """Whether the run stores its consumer's watermark (a watermark run, not a backfill)."""
        return self.record is not None

    @property
    def mode(self) -> str:
        """`watermark` (stores the consumer's watermark when done) or `backfill` (stores nothing)."""
        return "watermark" if self.stores else "backfill"

    @property
    def delivered(self) -> bool:
        """A resumed run whose sink already succeeded: it only stores the watermark."""
        return self.record is not None and self.record.state in (run_record.DELIVERED, run_record.STORED)

    @property
    def token(self) -> RunToken:
        """The run's identity for commits: consumer, ranges and stream incarnations."""
        if self.record is not None:
            return RunToken(self.consumer, run_record.ranges_of(self.record), self.record.incarnations)
        return RunToken(
            self.consumer,
            self.ranges,
            {s: self.incarnations[s] for s in self.ranges if s in self.incarnations},
        )

    @property
    def stream_target(self) -> Target:
        """The stream or super stream planned, as the one `Target` value."""
        return Target(self.target, self.superstream)

    @property
    def offsets_span(self) -> int:
        """Offsets covered (an upper bound on rows: offset-tracking entries take offsets too)."""
        return sum(e - s for s, e in self.ranges.values())

    def release(self) -> None:
        """Give back the consumer's lease (a run's last step; idempotent)."""
        if self.lease is not None:
            self.lease.release()


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
    persist: bool | None = None,
    pipeline: str | None = None,
    lease_wait_s: float | None = None,
) -> ReadPlan:
    """Fix `[start, end)` per partition stream now (tails as of this call), metadata only.

    A run that stores its consumer's watermark (`persist`; by default exactly the runs that start
    at the watermark) first takes the consumer's lease (`ConsumerBusyError` when another run holds
    it past `lease_wait_s`, default `DEFAULT_LEASE_WAIT_S`), then resumes the consumer's unfinished
    run record whole (same ranges, same token) or plans anew and writes a `planned` record, all
    before anything is read. Other runs (explicit offsets or times: backfills) hold nothing,
    record nothing and never store. Release the lease with `plan.release()` if the plan is not
    run (`run_read`, `run_consume` and the operators release it).
    """
    if starting_offsets not in ("earliest", "latest"):
        raise ConfigurationError(f"starting_offsets must be 'earliest' or 'latest'; got {starting_offsets!r}")
    if max_messages is not None and max_messages < 1:
        raise ConfigurationError(f"max_messages must be at least 1; got {max_messages}")
    target = Target.of(stream, superstream)
    watermark_start = isinstance(start, str) and start == "watermark"
    if not consumer or not (watermark_start if persist is None else persist):
        return _plan(
            conn, target, consumer, start, end, max_messages, starting_offsets, fail_on_data_loss, None
        )

    def holder() -> str:  # asked only when another run holds the name
        busy = run_record.latest(conn, consumer, target.name)
        return busy.holder() if busy is not None and not busy.done else ""

    lease = acquire_lease(
        conn,
        run_record.RUNS_STREAM,
        run_record.run_key(consumer, target.name),
        wait_s=DEFAULT_LEASE_WAIT_S if lease_wait_s is None else lease_wait_s,
        holder=holder,
        what=f"consumer '{consumer}' on {target.describe()}",
    )
    try:
        # Under the lease nobody else writes it; the pointer is marked on the lease (`Lease.keep`).
        previous = run_record.latest(conn, consumer, target.name, lease=lease)
        plan = _plan(
            conn,
            target,
            consumer,
            start,
            end,
            max_messages,
            starting_offsets,
            fail_on_data_loss,
            previous,
            resume=watermark_start,
            stores=True,
        )
        if plan.record is None:  # a new run: its record is written before anything is read
            record = run_record.RunRecord(
                consumer=consumer,
                run_id=uuid.uuid4().hex,
                target=plan.target,
                superstream=plan.superstream,
                state=run_record.PLANNED,
                ranges={s: (plan.start[s], plan.end[s]) for s in plan.start},
                incarnations=dict(plan.incarnations),
                seen=dict(plan.seen),
                token=plan.token.value,
                pipeline=pipeline,
            )
            plan = replace(plan, record=run_record.write(conn, record, lease=lease))
        return replace(plan, lease=lease)
    except BaseException:
        lease.release()
        raise


def _plan(
    conn: ConnectionOptions,
    target: Target,
    consumer: str | None,
    start: Position,
    end: Position,
    max_messages: int | None,
    starting_offsets: str,
    fail_on_data_loss: bool,
    previous: RunRecord | None,
    *,
    resume: bool = False,
    stores: bool = False,
) -> ReadPlan:
    """The plan itself: resume `previous` when it is unfinished, else resolve the positions.

    A run that `stores` watermarks marks streams without an incarnation (it writes offsets into
    them anyway); any other plan only reads the markers: a backfill writes nothing into its streams.
    """
    w = watermarks(conn, consumer or "", **target.kw())
    seen = w.stored_offsets()
    # A watermark run marks streams without an incarnation (it stores offsets in them anyway).
    incarnations = incarnations_of(conn, [p.stream for p in w.partitions], mark=stores)
    usable = previous if previous is not None and _same_streams(previous, w.target, incarnations) else None
    if previous is not None and usable is None:
        log.warning(
            "the run record of consumer '%s' on '%s' was planned on streams since deleted and created "
            "again: it no longer applies",
            consumer,
            previous.target,
        )
    if resume and usable is not None and not usable.done and not _moved_by_others(usable, seen, consumer):
        log.info("consumer '%s' has an unfinished run (%s): resuming it whole", consumer, usable.holder())
        return _resumed(w, usable, incarnations, fail_on_data_loss)
    client = BrokerClient(conn)
    b = Bounds({p.stream: p.first for p in w.partitions}, {p.stream: p.tail for p in w.partitions})
    stored: dict[str, int | None] | None = None
    recorded: dict[str, int] = {}
    if consumer:
        stored = dict(seen)
        if usable is not None:  # where the last run ended, on partitions that stored nothing yet
            recorded = {s: r[1] for s, r in usable.ranges.items() if seen.get(s) is None}
    starts = resolve_positions(client, b, start, is_end=False, stored=stored, fallback=starting_offsets)
    lost = timestamp_start_loss(client, b, start, fail_on_data_loss)
    if isinstance(start, str) and start == "watermark":
        starts.update({s: v for s, v in recorded.items() if s in starts})
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
    if max_messages is not None:
        ends = off.apply_limit(starts, ends, max_messages)
    return ReadPlan(
        w.target,
        w.superstream,
        consumer,
        starts,
        ends,
        seen,
        False,
        fail_on_data_loss,
        incarnations,
        data_loss=lost,
    )


def _resumed(w: Watermarks, record: RunRecord, incarnations: dict[str, int], fail: bool) -> ReadPlan:
    """The plan of an unfinished record: its ranges exactly, whatever arrived or was stored since.

    What retention removed from a range since the record was written is data loss (reported; with
    failOnDataLoss=false the reader skips it). The token stays the record's.
    """
    starts = {s: r[0] for s, r in record.ranges.items()}
    ends = {s: r[1] for s, r in record.ranges.items()}
    firsts = {p.stream: p.first for p in w.partitions}
    for s in starts:
        first = firsts.get(s)
        if first is None and ends[s] > starts[s]:  # a partition of the record vanished
            report_data_loss(fail, lost_message(s, starts[s], ends[s], "the partition stream is gone"))
            ends[s] = starts[s]
        elif first is not None and starts[s] < first and ends[s] > starts[s]:
            why = "retention removed them before this retry"
            report_data_loss(fail, lost_message(s, starts[s], min(first, ends[s]), why))
    return ReadPlan(
        w.target,
        w.superstream,
        record.consumer,
        starts,
        ends,
        dict(record.seen),
        True,
        fail,
        incarnations,
        record,
    )


def _moved_by_others(record: RunRecord, seen: Mapping[str, int | None], consumer: str | None) -> bool:
    """Whether someone else moved a watermark since `record` planned (neither the run's own store
    nor the value it saw): its plan is stale, and storing its end would fail anyway."""
    moved = {
        s: (record.seen.get(s), now)
        for s, now in seen.items()
        if s in record.ranges and now not in (record.seen.get(s), record.ranges[s][1] - 1)
    }
    if moved:
        log.warning(
            "consumer '%s': the watermark moved since its unfinished run planned (%s): planning anew",
            consumer,
            moved,
        )
    return bool(moved)


def _same_streams(record: RunRecord, target: str, incarnations: Mapping[str, int]) -> bool:
    """Whether `record` was planned on these very streams (same target, no partition re-created)."""
    if record.target != target:
        return False
    return all(same_incarnation(v, incarnations.get(s, v)) for s, v in record.incarnations.items())


# --------------------------------------------------------------------------------------- Spark


WORKER_PYTHON_CONF = ("spark.pyspark.python", "spark.pyspark.driver.python")


def worker_python_env(conf: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """What a local session started by rmqs adds to the environment: its workers' Python.

    Spark starts its Python workers (the data source lookup at startup, readers, writers) with
    `PYSPARK_PYTHON` / `PYSPARK_DRIVER_PYTHON`, else the `python3` on PATH: for a script run as
    `venv/bin/python x.py` without activating the venv, that is an interpreter without rmqs, and
    `format("rabbitmq_streams")` fails with DATA_SOURCE_NOT_FOUND (docs/troubleshooting.md). So
    both become this interpreter, unless the user chose one (either variable, or
    `spark.pyspark.python` / `spark.pyspark.driver.python` in `conf`): then nothing changes.
    """
    if any(environ.get(v) for v in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")):
        return {}
    if any(conf.get(k) for k in WORKER_PYTHON_CONF):
        return {}
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def spark_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    remote: str | None = None,
    app: str = "rmqs",
) -> SparkSession:
    """A local SparkSession (its Python workers run this interpreter), or Spark Connect with `remote`.

    Used by the Airflow operators and Dagster's `SparkSessionResource`; the workers' Python is set
    only when the user set none (`worker_python_env`). A Spark Connect server has its own Python.
    The driver JVM of a new local session maps Spark's class-data archive when `rmqs spark-archive`
    dumped one and the user set no Java options of their own (`spark.jvm.driver_options`).
    """
    import os

    from pyspark.sql import SparkSession

    from pyspark_rmqs.spark import jvm

    if remote:
        builder = SparkSession.builder.remote(remote).appName(app)
    else:
        master = master or "local[2]"
        os.environ.update(worker_python_env(conf or {}, os.environ))
        if master.startswith("local"):  # a cluster's executors must reach the driver: not loopback
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            SparkSession.builder.master(master)
            .appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
        )
        for k, v in jvm.driver_options(conf or {}).items():
            builder = builder.config(k, v)
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
    # Leave out offsets that earlier runs of the consumer committed here (commits recognised per
    # partition range); False for an output each run replaces whole (a Dagster time window).
    skip_committed: bool = True

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
    `token=` too when it takes that keyword (so it can make its own writes idempotent). A resumed
    run whose record says its sink already succeeded only stores. A failure carries its
    `commit_state` (`errors.CommitState`). The consumer's lease is released at the end, whatever
    happened.
    """
    try:
        t0 = time.monotonic()
        token = plan.token
        exactly_once = isinstance(sink, FileOutput) and sink.exactly_once
        summary = new_summary(plan, token, pipeline, retry_count, exactly_once=exactly_once)
        if plan.delivered and not exactly_once:  # an exactly-once output's record has the counts
            skip_delivered(plan, summary)
        elif not plan.is_empty:
            extra = {} if metadata_fields is None else {_SOURCE("metadata_fields"): metadata_fields}
            if exactly_once:
                assert isinstance(sink, FileOutput)
                _commit_files(spark, conn, plan, sink, token, summary, extra)
            else:
                try:
                    obs = _read_into(
                        spark, conn, plan, extra, summary, lambda df: _call_sink(sink, df, token)
                    )
                except BaseException as e:
                    raise mark_commit_state(e, CommitState.BEFORE) from None
                _count_read(summary, obs)
            if not plan.fail_on_data_loss:
                summary.extra["data_loss"] = merge_spans(plan.data_loss, _retention_during(conn, plan))
        elif plan.data_loss:  # nothing left to read: what planning found lost and skipped
            summary.extra["data_loss"] = dict(plan.data_loss)
        return finish_run(conn, plan, summary, t0, store_watermark=store_watermark)
    finally:
        plan.release()


def new_summary(
    plan: ReadPlan, token: RunToken, pipeline: str | None, retry_count: int, *, exactly_once: bool
) -> RunSummary:
    """The summary a run fills in: its range, identity, token and delivery (Spark and Spark-free runs)."""
    summary = RunSummary(plan.target, dict(plan.start), dict(plan.end), rows=0, bytes=0, records_written=0)
    summary.pipeline, summary.retry_count, summary.token = pipeline, retry_count, token.value
    summary.delivery = "exactly_once" if exactly_once else "at_least_once"
    summary.extra["mode"] = plan.mode
    if plan.record is not None:
        summary.run_id = plan.record.run_id
    return summary


def skip_delivered(plan: ReadPlan, summary: RunSummary) -> None:
    """A resumed run whose record says the sink already succeeded: deliver nothing again."""
    log.info(
        "the run of %s already delivered %s (its record says so): only storing", plan.consumer, plan.ranges
    )
    summary.rows = summary.bytes = summary.records_written = None
    summary.extra["sink_skipped"] = True


def finish_run(
    conn: ConnectionOptions, plan: ReadPlan, summary: RunSummary, started: float, *, store_watermark: bool
) -> RunSummary:
    """The end of every run once its sink succeeded: record it, store the watermark, then report.

    A watermark run first moves its record to `delivered` (a retry from here on only stores), then
    stores `end - 1` on every partition (checked against other runs, never backwards; an empty
    partition that stored nothing yet stores `start - 1`, so a consumer starting at `latest` keeps
    its place), then moves its record to `stored`. A failure after `delivered` is marked
    `COMMITTED`: a retry only stores. Then the lag after the run, the time taken, and one
    structured log line with the whole summary.

    Before each of those three writes the run keeps its lease (`Lease.keep`: a local flag while
    held; when its connection closed under the run, the lease is taken back and the record must be
    as this run left it, else `LeaseLostError` before that write; see there for the window between
    the check and the write).
    """
    record = plan.record
    if store_watermark and record is not None and plan.consumer:
        t_store = time.monotonic()
        lease = plan.lease
        if record.state == run_record.PLANNED:
            record = run_record.advance(conn, record, run_record.DELIVERED, lease=lease)
        wanted = _watermarks_to_store(plan)
        try:
            if lease is not None:
                lease.keep("its watermarks")
            kept = store_watermarks_checked(conn, plan.consumer, wanted, plan.seen, resumed=plan.resumed)
            run_record.advance(conn, record, run_record.STORED, lease=lease)
        except BaseException as e:
            raise mark_commit_state(e, CommitState.COMMITTED) from None
        if kept:  # an explicit range behind the watermark: never moved backwards
            summary.extra["watermark_kept"] = kept
        summary.commit_ms = round((summary.commit_ms or 0.0) + _ms_since(t_store), 3)
        summary.watermark_stored = len(wanted) > len(kept)
    if plan.resumed:
        summary.extra["resumed_plan"] = True
    if plan.consumer:
        summary.lag_after = watermarks(conn, plan.consumer, **plan.stream_target.kw()).total_lag
    summary.seconds = round(time.monotonic() - started, 3)
    log.info("rmqs run on '%s': %s", plan.target, json.dumps(summary.to_dict(), default=str))
    return summary


def _watermarks_to_store(plan: ReadPlan) -> dict[str, int]:
    """`end - 1` where the run read; `start - 1` where it read nothing and nothing is stored yet."""
    out = watermarks_after(plan.ranges)
    for s, start in plan.start.items():
        if s not in out and plan.seen.get(s) is None and start > 0:
            out[s] = start - 1
    return out


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
    done = commits.committed_spans(token) if sink.skip_committed else {}  # earlier runs' commits here
    if done:
        log.info("the output already holds %s of consumer '%s': not written again", done, plan.consumer)
        summary.extra["already_committed"] = {s: [list(x) for x in v] for s, v in done.items()}
    try:
        files = commits.published_files(token)  # published, then the attempt died before its record
        if files is None and covers(done, plan.ranges):
            files, summary.rows, summary.bytes = [], 0, 0
            summary.records_written = 0
            summary.extra["sink_skipped"] = True
        elif files is None:
            stage = commits.begin(token)
            obs = _read_into(
                spark,
                conn,
                plan,
                extra,
                summary,
                lambda df: sink.write_to(df, str(stage), "overwrite"),
                exclude=done,
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
    *,
    exclude: Mapping[str, list[tuple[int, int]]] | None = None,
) -> Any:
    """Read `plan` once into `write` (one Spark action), measured: the sink's time (`flush_ms`) and
    the executors' fetch and decode time; returns the observation of its rows and bytes
    (`_count_read`), which holds once the action ran. Offsets in `exclude` (already in the output)
    are left out before anything is counted or written."""
    with ExecutorReadMetrics(spark) as metrics:
        df = read_dataframe(spark, conn, plan, **extra)
        if exclude:
            df = df.where(~_in_spans(exclude))
        df, obs = observe_counts(df)
        t_sink = time.monotonic()
        write(df)
        summary.flush_ms = _ms_since(t_sink)
    metrics.fill(summary)
    return obs


def _in_spans(spans: Mapping[str, list[tuple[int, int]]]) -> Any:
    """A Spark condition: the row's (stream, offset) lies in one of `spans`."""
    from pyspark.sql import functions as F

    cond = F.lit(False)
    for stream, ranges in spans.items():
        for a, b in ranges:
            cond = cond | ((F.col("stream") == stream) & (F.col("offset") >= a) & (F.col("offset") < b))
    return cond


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
        # A drain writes no record, but a watermark run or `rmqs watermark set` of the name would:
        # a lease lost under the drain and taken back proves nobody wrote one meanwhile.
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
    lease.keep("its final watermarks")  # the one store the drain makes itself (the source's: below)
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
