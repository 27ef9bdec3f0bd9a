"""Reading without Spark under the watermark protocol: `run_consume`, `ParquetSink`, `FunctionSink`.

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.runs.consume`. A facade:
nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow and
Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.runs.consume import (
    READ_OPTIONS,
    FunctionSink,
    ParquetSink,
    RangeSink,
    range_file_name,
    read_settings,
    run_consume,
)

__all__ = [
    "READ_OPTIONS",
    "FunctionSink",
    "ParquetSink",
    "RangeSink",
    "range_file_name",
    "read_settings",
    "run_consume",
]
