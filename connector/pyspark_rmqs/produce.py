"""Publishing without Spark: `publish`, `run_produce`, `encode_message`.

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.runs.produce`. A facade:
nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow and
Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.runs.produce import (
    ProduceResult,
    encode_message,
    publish,
    run_produce,
)

__all__ = [
    "ProduceResult",
    "encode_message",
    "publish",
    "run_produce",
]
