"""Reading only what committed runs wrote: `committed_files`, `committed_dataset`.

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.runs.outputs.committed`. A facade:
nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow and
Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.runs.outputs.committed import (
    committed_dataset,
    committed_files,
)

__all__ = [
    "committed_dataset",
    "committed_files",
]
