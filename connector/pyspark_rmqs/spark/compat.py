"""PySpark internals rmqs relies on, in one place, each pinned by a test that fails when PySpark changes.

Run metrics: a task finds the accumulator its job set up (by id, in a local property) through
`pyspark.accumulators._deserialize_accumulator`, the function PySpark itself uses to rebuild an
accumulator on a worker; `task_accumulator` wraps it, and the test checks its signature.

PySpark hands `spark.sql.python.filterPushdown.enabled` to its planning worker but not to the data
source, and fails a read whose reader implements `pushFilters` while the setting is off (the
default). The worker keeps the setting in a local of `pyspark.sql.worker.plan_data_source_read._main`;
`pushdown_enabled` reads it from there. `tests/unit/test_spark_compat.py` checks that PySpark's
worker still has that local, so a rename fails the suite instead of silently turning pushdown off.
"""

from __future__ import annotations

import sys
from typing import Any

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


def task_accumulator(aid: int, zero: Any, param: Any) -> Any:
    """On an executor: the accumulator `aid` of the running task's job (updates go back with the task)."""
    from pyspark.accumulators import _deserialize_accumulator

    return _deserialize_accumulator(aid, zero, param)
