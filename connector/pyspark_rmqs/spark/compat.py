"""PySpark internals rmqs relies on, in one place, each pinned by a test that fails when PySpark changes.

Run metrics: a task finds the accumulator its job set up (by id, in a local property) through
`pyspark.accumulators._deserialize_accumulator`, the function PySpark itself uses to rebuild an
accumulator on a worker; `task_accumulator` wraps it, and the test checks its signature.

PySpark hands `spark.sql.python.filterPushdown.enabled` to its planning worker but not to the data
source, and fails a read whose reader implements `pushFilters` while the setting is off (the
default). The worker keeps the setting in a local of `pyspark.sql.worker.plan_data_source_read._main`
(`main` in PySpark 4.1); `pushdown_enabled` reads it from there. `tests/unit/test_spark_compat.py`
checks that PySpark's worker still has that local, so a rename fails the suite instead of silently
turning pushdown off.

Admission control: PySpark 4.2 added `pyspark.sql.streaming.datasource` (`ReadLimit` and its kinds,
`SupportsTriggerAvailableNow`) and calls a stream reader's `latestOffset(start, limit)` when its
signature takes arguments; PySpark 4.0 and 4.1 call `latestOffset()` with none and have no read
limits. On those, `ADMISSION_CONTROL` is False and stand-ins of the same names keep the streaming
reader importable (Spark never passes or asks for one of them there); `needs_admission_control`
is the error a read limit option gets (docs/compatibility.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import pyspark

from pyspark_rmqs.core.errors import ConfigurationError

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
except ImportError:  # PySpark 4.0 and 4.1
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in: PySpark < 4.2 has no read limits."""

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Stand-in: PySpark < 4.2 has no read limits."""

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        """Stand-in: PySpark < 4.2 has no read limits."""

        max_rows: int

    @dataclass
    class ReadMaxBytes(ReadLimit):  # type: ignore[no-redef]
        """Stand-in: PySpark < 4.2 has no read limits."""

        max_bytes: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in: PySpark < 4.2 drains an AvailableNow query in one batch to the tails it saw first."""

        def prepareForTriggerAvailableNow(self) -> None:
            """Never called by PySpark < 4.2."""


ADMISSION_CONTROL_SINCE = "4.2"
__all__ = [
    "ADMISSION_CONTROL",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxBytes",
    "ReadMaxRows",
    "SupportsTriggerAvailableNow",
]


def needs_admission_control(option: str) -> ConfigurationError:
    """The error of a read limit option on a PySpark without admission control (< 4.2)."""
    return ConfigurationError(
        f"{option} needs Spark {ADMISSION_CONTROL_SINCE} or later: admission control for Python "
        f"streaming sources (latestOffset(start, limit)) came with PySpark {ADMISSION_CONTROL_SINCE}, "
        f"and this is PySpark {pyspark.__version__}; remove {option} (each micro-batch then reads "
        f"everything available) or run Spark {ADMISSION_CONTROL_SINCE}+"
    )


PLANNING_WORKER_MODULE = "pyspark.sql.worker.plan_data_source_read"
PLANNING_FUNCTION = "_main"
PLANNING_FUNCTIONS = (PLANNING_FUNCTION, "main")  # PySpark 4.2+, 4.1
PUSHDOWN_LOCAL = "enable_pushdown"


def pushdown_enabled() -> bool:
    """Whether filter pushdown is on for the read being planned (False outside PySpark's planner)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in PLANNING_FUNCTIONS and PUSHDOWN_LOCAL in frame.f_locals:
            return bool(frame.f_locals[PUSHDOWN_LOCAL])
        frame = frame.f_back  # type: ignore[assignment]
    return False


def task_accumulator(aid: int, zero: Any, param: Any) -> Any:
    """On an executor: the accumulator `aid` of the running task's job (updates go back with the task)."""
    from pyspark.accumulators import _deserialize_accumulator

    return _deserialize_accumulator(aid, zero, param)
