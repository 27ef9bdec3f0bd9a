"""The watermark protocol (DESIGN §4), in its order: plan -> read -> sink -> commit -> store.

Shared by the Airflow operators, the Dagster assets and the CLI, so all behave alike. The order in
which a run plans, reads, hands the rows to the sink, commits its output and stores the watermark
is the delivery guarantee, so the steps and every transition of the run record are here, in one
read; how each step is done lives beside it:

1. `plan_read` fixes the range per partition stream before anything is read. A run that stores its
   consumer's watermark takes the consumer's lease, then resumes the consumer's unfinished run
   record whole or plans anew (`plan.plan_range`: how a retry finds its range) and writes a
   `planned` record, before reading: any retry, on any worker, reads the same rows.
2. `run_read` reads exactly that range with Spark (`spark_io`), hands the DataFrame to the sink,
   and commits an exactly-once file output under the run's token (`_commit_files`,
   `outputs/delivery.py`); `consume.run_consume` is the same step without Spark.
3. `finish_run` (every run, Spark or not) moves the record to `delivered`, stores the new
   watermarks (`end - 1`, never backwards, `WatermarkConflictError` if another run moved them),
   then moves the record to `stored`. Any failure before that leaves the watermark alone and the
   plan pending: at-least-once, same rows.
4. `drain.run_drain` does the same with a Structured Streaming query and `Trigger.AvailableNow`.

pyspark is imported only inside the Spark-running functions: planning is metadata only. What a run
reports is `summary.RunSummary`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.positions import Position, check_time_end, is_timestamp, merge_spans
from pyspark_rmqs.core.errors import CommitState, ConfigurationError, mark_commit_state
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.options import ConnectionOptions, SourceOptions
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.lease import DEFAULT_WAIT_S as DEFAULT_LEASE_WAIT_S
from pyspark_rmqs.runs.lease import acquire as acquire_lease
from pyspark_rmqs.runs.outputs.delivery import FileCommits, RunToken, covers, takes_token
from pyspark_rmqs.runs.plan import ReadPlan, report_retry_loss
from pyspark_rmqs.runs.plan import plan_range as _plan
from pyspark_rmqs.runs.spark_io import FileOutput
from pyspark_rmqs.runs.spark_io import count_read as _count_read
from pyspark_rmqs.runs.spark_io import read_into as _read_into
from pyspark_rmqs.runs.summary import RunSummary
from pyspark_rmqs.runs.summary import ms_since as _ms_since
from pyspark_rmqs.runs.watermarks import store_watermarks_checked, watermarks, watermarks_after

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The steps' mechanics (plan.py, spark_io.py, summary.py) are imported above under the names the
# steps below have always used (`_plan`, `_read_into`, `_count_read`, `_ms_since`).

log = logging.getLogger(__name__)
_SOURCE = SourceOptions.alias  # option names users type, from the option table


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

    An `end` given as a time must have passed by the broker's clock (`positions.check_time_end`):
    before it has, the range would stop at the tails and a message timestamped before the end that
    arrives later would be in neither this range nor the next, which starts at that time. Such a
    plan fails with the retryable `OpenWindowError` before anything is read or recorded.

    Every storing run resumes an unfinished record, whatever its start (a run planned at explicit
    offsets or times and killed after its output committed must not plan a new range on retry).
    A resumed record is written again first (`RunRecord.taken_over`: its next attempt), so the
    record pointer moves before this run reads: a run that lost the lease while still in its sink
    finds the pointer moved at its next lease check (`Lease.fence`) and stops before it commits.
    """
    if starting_offsets not in ("earliest", "latest"):
        raise ConfigurationError(f"starting_offsets must be 'earliest' or 'latest'; got {starting_offsets!r}")
    if max_messages is not None and max_messages < 1:
        raise ConfigurationError(f"max_messages must be at least 1; got {max_messages}")
    target = Target.of(stream, superstream)
    if is_timestamp(end):  # before the tails are measured, so they are final for the range
        client = BrokerClient(conn)
        check_time_end(client, target.streams(client), end, datetime.now(UTC), start=start)
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
            resume=True,
            stores=True,
        )
        if plan.record is not None:  # resumed: the takeover moves the pointer (the fence, see below)
            plan = replace(plan, record=run_record.write(conn, plan.record.taken_over(), lease=lease))
        else:  # a new run: its record is written before anything is read
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


def run_read(
    spark: SparkSession | None,
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
    happened. `spark` may be None for a plan with nothing to read (a local session is a new JVM).
    """
    try:
        t0 = time.monotonic()
        token = plan.token
        exactly_once = isinstance(sink, FileOutput) and sink.exactly_once
        summary = new_summary(plan, token, pipeline, retry_count, exactly_once=exactly_once)
        if plan.delivered and not exactly_once:  # an exactly-once output's record has the counts
            skip_delivered(plan, summary)
        elif not plan.is_empty:
            if spark is None:
                raise ValueError(f"run_read: reading {plan.target} needs a SparkSession (got None)")
            extra = {} if metadata_fields is None else {_SOURCE("metadata_fields"): metadata_fields}
            if exactly_once:
                assert isinstance(sink, FileOutput)
                _commit_files(spark, conn, plan, sink, token, summary, extra)
            else:
                try:
                    report_retry_loss(plan)  # read again: what retention took from a resumed range
                    obs = _read_into(
                        spark, conn, plan, extra, summary, lambda df: _call_sink(sink, df, token)
                    )
                except BaseException as e:
                    raise mark_commit_state(e, CommitState.BEFORE) from None
                _count_read(summary, obs)
            if not plan.fail_on_data_loss:
                summary.extra["data_loss"] = merge_spans(
                    plan.data_loss, retention_during(conn, plan.target, plan.ranges)
                )
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
        wanted = _watermarks_to_store(plan)
        try:  # the sink returned (an exactly-once output committed): a retry finds that, or delivers again
            if record.state == run_record.PLANNED:
                record = run_record.advance(conn, record, run_record.DELIVERED, lease=lease)
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
        summary.extra["files"] = [commits.path_of(f) for f in record.files]
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
            report_retry_loss(plan, done)  # read again: what retention took from a resumed range
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
            _fence(plan, "its files' publish")
            files = commits.publish(token, stage)
        else:
            summary.rows = summary.bytes = summary.records_written = None
    except BaseException as e:
        raise mark_commit_state(e, CommitState.BEFORE) from None
    t_commit = time.monotonic()
    try:
        _fence(plan, "its output's commit record")
    except BaseException as e:
        raise mark_commit_state(e, CommitState.BEFORE) from None
    try:
        commits.commit(token, files, summary.rows, summary.bytes)
    except BaseException as e:
        raise mark_commit_state(e, CommitState.UNKNOWN) from None
    summary.commit_ms = _ms_since(t_commit)
    summary.bytes_written = sum((commits.root / f).stat().st_size for f in files)
    # The paths of the run's files, as the Spark-free consume run reports them: what a downstream
    # task loads (a count would make it list the folder, and tell this run's files from others' by name).
    summary.extra["files"] = [commits.path_of(f) for f in files]


def _fence(plan: ReadPlan, before: str) -> None:
    """No publish or commit after another run took the name over (`Lease.fence`: one round trip)."""
    if plan.lease is not None:
        plan.lease.fence(before)


def _call_sink(sink: Callable[..., Any], df: DataFrame, token: RunToken) -> Any:
    """`sink(df, token=...)` when the sink takes a `token` keyword, else `sink(df)`."""
    return sink(df, token=token) if takes_token(sink) else sink(df)


def retention_during(
    conn: ConnectionOptions, target: str, ranges: Mapping[str, tuple[int, int]]
) -> dict[str, list[int]]:
    """Per stream, the part of `ranges` (read from `target`) retention removed by the end of the
    read: `[start, first)`.

    With `failOnDataLoss=false` the executors (or a drain's source) skip, and log with exact
    offsets, what retention removed before they read it; offsets of this span they read earlier are
    in the output. The summary names the span so a run that may have lost rows never looks like a
    clean one.
    """
    firsts = BrokerClient(conn).bounds(ranges)
    out: dict[str, list[int]] = {}
    for s, (start, end) in ranges.items():
        found = firsts.get(s)
        first = end if found is None else found[0]  # a deleted stream: the whole range
        if first > start:
            out[s] = [start, min(first, end)]
    if out:
        log.warning(
            "rmqs run on '%s': retention removed %s during the read (failOnDataLoss=false)", target, out
        )
    return out
