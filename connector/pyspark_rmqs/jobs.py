"""The watermark protocol's entry points for orchestrators: `plan_read`, `run_read`, `run_drain`,
`spark_session`, `read_options`, `write_output`, `RunSummary`.

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.runs.steps`. A facade only:
nothing in rmqs imports it (the layers contract in pyproject.toml).
"""

from __future__ import annotations

from pyspark_rmqs.runs.steps import (
    DEFAULT_LEASE_WAIT_S,
    WORKER_PYTHON_CONF,
    ExecutorReadMetrics,
    FileOutput,
    ReadPlan,
    RunSummary,
    finish_run,
    new_summary,
    observe_counts,
    observed_counts,
    plan_read,
    read_dataframe,
    read_options,
    run_drain,
    run_read,
    skip_delivered,
    spark_session,
    worker_python_env,
    write_output,
)

__all__ = [
    "DEFAULT_LEASE_WAIT_S",
    "WORKER_PYTHON_CONF",
    "ExecutorReadMetrics",
    "FileOutput",
    "ReadPlan",
    "RunSummary",
    "finish_run",
    "new_summary",
    "observe_counts",
    "observed_counts",
    "plan_read",
    "read_dataframe",
    "read_options",
    "run_drain",
    "run_read",
    "skip_delivered",
    "spark_session",
    "worker_python_env",
    "write_output",
]
