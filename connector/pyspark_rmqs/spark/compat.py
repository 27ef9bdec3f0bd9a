"""PySpark internals rmqs relies on, in one place, each pinned by a test that fails when PySpark changes.

PySpark hands `spark.sql.python.filterPushdown.enabled` to its planning worker but not to the data
source, and fails a read whose reader implements `pushFilters` while the setting is off (the
default). The worker keeps the setting in a local of `pyspark.sql.worker.plan_data_source_read._main`;
`pushdown_enabled` reads it from there. `tests/unit/test_spark_compat.py` checks that PySpark's
worker still has that local, so a rename fails the suite instead of silently turning pushdown off.
"""

from __future__ import annotations

import sys

PLANNING_WORKER_MODULE = "pyspark.sql.worker.plan_data_source_read"
PLANNING_FUNCTION = "_main"
PUSHDOWN_LOCAL = "enable_pushdown"


def pushdown_enabled() -> bool:
    """Whether filter pushdown is on for the read being planned (False outside PySpark's planner)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == PLANNING_FUNCTION and PUSHDOWN_LOCAL in frame.f_locals:
            return bool(frame.f_locals[PUSHDOWN_LOCAL])
        frame = frame.f_back  # type: ignore[assignment]
    return False
