"""Lag from a streaming query's progress (`lag_from_progress`, also `pyspark_rmqs.lag_from_progress`).

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.core.progress`. A facade:
nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow and
Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.core.progress import (
    lag_from_progress,
)

__all__ = [
    "lag_from_progress",
]
