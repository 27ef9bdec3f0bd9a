"""The watermark protocol's entry points for orchestrators: `plan_read`, `run_read`, `run_drain`,
`spark_session`, `read_options`, `write_output`, `RunSummary`; for a run in a Spark application of
its own (spark-submit): `run_job`, `job_outcome`, `APPLICATION`.

A public import path, kept where users type it (docs/options.md, docs/troubleshooting.md); the
code is in `pyspark_rmqs.runs`: `steps` (the protocol's order), `plan` (a run's range), `spark_io`
(Spark's side), `summary` (what a run did), `drain`, `submitted` (a run as a spark-submit job).
A facade: nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow
and Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.runs.drain import run_drain
from pyspark_rmqs.runs.lease import DEFAULT_WAIT_S as DEFAULT_LEASE_WAIT_S
from pyspark_rmqs.runs.plan import ReadPlan
from pyspark_rmqs.runs.spark_io import (
    WORKER_PYTHON_CONF,
    ExecutorReadMetrics,
    FileOutput,
    observe_counts,
    observed_counts,
    read_dataframe,
    read_options,
    spark_session,
    worker_python_env,
    write_output,
)
from pyspark_rmqs.runs.steps import finish_run, new_summary, plan_read, run_read, skip_delivered
from pyspark_rmqs.runs.submitted import APPLICATION, JobOutcome, job_outcome, run_job
from pyspark_rmqs.runs.summary import RunSummary

__all__ = [
    "APPLICATION",
    "DEFAULT_LEASE_WAIT_S",
    "WORKER_PYTHON_CONF",
    "ExecutorReadMetrics",
    "FileOutput",
    "JobOutcome",
    "ReadPlan",
    "RunSummary",
    "finish_run",
    "job_outcome",
    "new_summary",
    "observe_counts",
    "observed_counts",
    "plan_read",
    "read_dataframe",
    "read_options",
    "run_drain",
    "run_job",
    "run_read",
    "skip_delivered",
    "spark_session",
    "worker_python_env",
    "write_output",
]
