"""Reading only what committed runs wrote: `committed_files`, `committed_dataset`.

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.runs.outputs.committed`. A facade only:
nothing in rmqs imports it (the layers contract in pyproject.toml).
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
