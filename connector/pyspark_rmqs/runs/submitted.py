"""A watermark run as a Spark application of its own: `spark-submit`, Airflow's `SparkSubmitOperator`,
Dagster Pipes. `run_job` is the job's side, `job_outcome` the orchestrator's.

When the Spark driver is not the orchestrator's process, the job runs the whole watermark run,
driver side, through `run_job`: it takes the consumer's lease, plans (or resumes the consumer's
unfinished run record whole: the same ranges and token, `plan.plan_range`), reads into the
exactly-once file output, commits it, and only then records `delivered`, stores the watermarks and
records `stored` (`steps`). No range or lease crosses a process boundary: a range handed from a
planning process to a job would need a second protocol for leases held across processes and for a
plan the job did not write. The orchestrator submits (consumer, target, output, its run identity),
and afterwards reads the run's outcome from the broker (`job_outcome`: the consumer's newest run
record and its lag), which is where the run left it whatever happened to the job's process.

A retried or killed job resumes the same range because resuming is the protocol's: a submission
finds the consumer's unfinished record (written before the read) and runs exactly it; its output
recognises the token, so a range committed before the kill is not written again, only stored.
The run identity (`pipeline`, e.g. `dag/task/run_id`) names the run in its record and summary.

The application spark-submit runs is `pyspark_rmqs/submit.py` (`APPLICATION`): arguments, the
connection from the `RMQS_*` environment (never argv: a process list shows it), exit codes.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark_rmqs.core.target import Target
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.spark_io import write_output
from pyspark_rmqs.runs.steps import plan_read, run_read
from pyspark_rmqs.runs.summary import RunSummary
from pyspark_rmqs.runs.watermarks import watermarks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# The file spark-submit runs (`python pyspark_rmqs/submit.py --help`): a path on the machine that
# submits; in client mode the driver runs it there, with the installed rmqs.
APPLICATION = str(Path(__file__).resolve().parents[1] / "submit.py")


def run_job(
    conn: ConnectionOptions,
    *,
    consumer: str,
    output_path: str,
    stream: str | None = None,
    superstream: str | None = None,
    output_format: str = "parquet",
    pipeline: str | None = None,
    retry_count: int = 0,
    max_messages: int | None = None,
    starting_offsets: str = "earliest",
    fail_on_data_loss: bool = True,
    lease_wait_s: float | None = None,
    spark: SparkSession | None = None,
) -> RunSummary:
    """One watermark run of `consumer` into the exactly-once output `output_path`, in this driver.

    `plan_read` (lease, then the unfinished record resumed or a new `planned` one), then `run_read`
    (read, commit the output under the run's token, then record `delivered`, store, record
    `stored`); the lease is released at the end whatever happened. A second job on the same
    consumer fails with `ConsumerBusyError` before it starts a SparkContext (planning is metadata
    only, and the session is asked for only when there is something to read): it takes no
    executors from the cluster. `spark`: default `SparkSession.builder.getOrCreate()`, the session
    spark-submit configured (master, deploy mode, conf); never a new local one.
    """
    plan = plan_read(
        conn,
        **Target.of(stream, superstream).kw(),
        consumer=consumer,
        starting_offsets=starting_offsets,
        max_messages=max_messages,
        fail_on_data_loss=fail_on_data_loss,
        pipeline=pipeline,
        lease_wait_s=lease_wait_s,
    )
    try:
        log.info(
            "rmqs job: consumer '%s' on '%s' ranges %s%s",
            consumer,
            plan.target,
            plan.ranges or "(nothing new)",
            " (resuming its unfinished run record)" if plan.resumed else "",
        )
        session = spark if spark is not None or plan.is_empty else _submitted_session()
        return run_read(
            session,
            conn,
            plan,
            write_output(output_path, output_format),
            pipeline=pipeline,
            retry_count=retry_count,
        )
    finally:
        plan.release()


def _submitted_session() -> SparkSession:
    """The session spark-submit set up: its master and conf, unchanged (no `.master(...)` here)."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.appName("rmqs-job").getOrCreate()


@dataclass(frozen=True)
class JobOutcome:
    """Where a consumer's newest run stands, read from the broker: what an orchestrator reports.

    `finished`: the newest record is `stored` (its output committed and its watermarks stored).
    `pipeline` is the identity that record was planned under (a resumed record keeps its first
    try's). `offsets`: the offsets its ranges cover (an upper bound on rows: tracking entries take
    offsets too). `lag`: messages past the watermark now.
    """

    consumer: str
    target: str
    state: str | None
    finished: bool
    run_id: str | None = None
    pipeline: str | None = None
    attempt: int = 0
    token: str | None = None
    ranges: dict[str, list[int]] = field(default_factory=dict)
    offsets: int = 0
    lag: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: an XCom value, Dagster metadata, `rmqs`-style output (no secret in it)."""
        return asdict(self)


def job_outcome(
    conn: ConnectionOptions, consumer: str, *, stream: str | None = None, superstream: str | None = None
) -> JobOutcome:
    """The consumer's newest run record on the target, and its lag: metadata only, no lease taken.

    Read after the job's process ended: a run that finished says `stored`; one killed before its
    store says `planned` or `delivered` (the next submission resumes it); None: no run recorded.
    """
    target = Target.of(stream, superstream)
    w = watermarks(conn, consumer, **target.kw())
    rec = run_record.latest(conn, consumer, w.target)
    if rec is None:
        return JobOutcome(consumer, w.target, None, False, lag=w.total_lag)
    ranges = dict(run_record.ranges_of(rec))
    return JobOutcome(
        consumer=consumer,
        target=w.target,
        state=rec.state,
        finished=rec.done,
        run_id=rec.run_id,
        pipeline=rec.pipeline,
        attempt=rec.attempt,
        token=rec.token,
        ranges={s: [a, b] for s, (a, b) in ranges.items()},
        offsets=sum(b - a for a, b in ranges.values()),
        lag=w.total_lag,
    )
