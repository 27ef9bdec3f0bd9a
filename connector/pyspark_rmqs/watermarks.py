"""Tails, stored offsets and lag of a consumer name; storing watermarks (never backwards).

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.runs.watermarks`. A facade:
nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow and
Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.runs.watermarks import (
    PartitionWatermark,
    Watermarks,
    astore_watermarks,
    awatermarks,
    store_watermarks,
    store_watermarks_checked,
    watermarks,
    watermarks_after,
)

__all__ = [
    "PartitionWatermark",
    "Watermarks",
    "astore_watermarks",
    "awatermarks",
    "store_watermarks",
    "store_watermarks_checked",
    "watermarks",
    "watermarks_after",
]
