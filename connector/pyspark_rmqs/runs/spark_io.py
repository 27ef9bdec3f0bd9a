"""Spark's side of a run: the session rmqs starts, the source options that read exactly a plan, the one
measured read of a plan into a sink, file outputs, and the counts and executor metrics it reports.

The protocol's order (plan -> read -> sink -> commit -> store) stays in `steps.py`; this module
holds how a step is done with Spark. pyspark is imported inside the functions only: importing this
module starts no JVM (Airflow's and Dagster's Spark-free paths import the run protocol).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark_rmqs.core import offsets as off
from pyspark_rmqs.options import ConnectionOptions, SourceOptions
from pyspark_rmqs.runs.outputs.delivery import check_delivery
from pyspark_rmqs.runs.plan import ReadPlan
from pyspark_rmqs.runs.summary import RunSummary, ms_since

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
_SOURCE = SourceOptions.alias  # option names users type, from the option table


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
    *,
    reuse_session: bool = True,
) -> SparkSession:
    """A local SparkSession (its Python workers run this interpreter), or Spark Connect with `remote`.

    With `remote`, the process's Connect session when it has one, else the server-side session
    every process with the same URL, app and `conf` shares (`connect_sessions`: the server's Python
    workers stay up between tasks), or one of its own with `reuse_session=False`.

    Used by the Airflow operators and Dagster's `SparkSessionResource`; the workers' Python is set
    only when the user set none (`worker_python_env`). A Spark Connect server has its own Python.
    The driver JVM of a new local session maps Spark's class-data archive when `rmqs spark-archive`
    dumped one and the user set no Java options of their own (`spark.jvm.driver_options`).
    """
    import os

    from pyspark.sql import SparkSession

    from pyspark_rmqs.runs.connect_sessions import connect
    from pyspark_rmqs.spark import jvm

    if remote:
        return connect(remote, app, conf, reuse_session=reuse_session, new=False)
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


def read_into(
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
    (`count_read`), which holds once the action ran. Offsets in `exclude` (already in the output)
    are left out before anything is counted or written."""
    with ExecutorReadMetrics(spark) as metrics:
        df = read_dataframe(spark, conn, plan, **extra)
        if exclude:
            df = df.where(~_in_spans(exclude))
        df, obs = observe_counts(df)
        t_sink = time.monotonic()
        write(df)
        summary.flush_ms = ms_since(t_sink)
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


def count_read(summary: RunSummary, obs: Any) -> None:
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
    session first (`spark.source.register_for_metrics`): Spark passes no accumulator to a data
    source it found by itself.
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.acc: Any = None
        self._sc: Any = None
        self._previous: str | None = None

    def __enter__(self) -> ExecutorReadMetrics:
        from pyspark_rmqs.spark.common import METRICS_PROPERTY, ReadMetrics
        from pyspark_rmqs.spark.source import register_for_metrics

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


def _count(summary: RunSummary, counts: dict[str, int] | None) -> None:
    summary.rows = counts["rows"] if counts else None
    summary.bytes = counts["bytes"] if counts else None
