"""The extension points' Protocols: `addressResolverClass`, `filterPostFilterClass`, `partitionerClass`.

A public import path, kept where users type it (docs/api.md); the code is in
`pyspark_rmqs.core.extensions`. A facade:
nothing in pyspark_rmqs imports it (the layers contract in pyproject.toml); the Airflow and
Dagster packages use it, as users do.
"""

from __future__ import annotations

from pyspark_rmqs.core.extensions import (
    AddressResolver,
    MessageView,
    Partitioner,
    PostFilter,
    load,
    required_methods,
)

__all__ = [
    "AddressResolver",
    "MessageView",
    "Partitioner",
    "PostFilter",
    "load",
    "required_methods",
]
