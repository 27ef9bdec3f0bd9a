"""What a run did (`RunSummary`, for XCom and Dagster metadata) and the clock its times are taken with.

Filled in by every kind of run (`steps.run_read`, `consume.run_consume`, `drain.run_drain`): the
measured metrics, never estimated (`spark_io.ExecutorReadMetrics` brings the executors' numbers).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RunSummary:
    """What a run did; JSON-friendly (XCom, Dagster metadata). No connection details, no secrets.

    The standard run metrics are measured where the run can measure them and None where it cannot:
    never estimated. `fetch_ms` and `decode_ms` are the readers' own clocks (`RangeReader.fetch_s`
    and `decode_s`); in a Spark run they are summed over its tasks (brought back by an accumulator,
    `ReadMetrics`), so a read of several partitions in parallel can exceed the wall time, as Spark's
    own task times do; None with Spark Connect, which has no accumulators. `rows` and `bytes` are
    kept as the names earlier releases used for `records_read` and `bytes_read`.
    """

    target: str
    start_offsets: dict[str, int]
    end_offsets: dict[str, int]
    rows: int | None = None
    bytes: int | None = None
    seconds: float = 0.0
    lag_after: int | None = None
    watermark_stored: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pipeline: str | None = None  # the DAG/task or asset key that ran it
    token: str | None = None  # the run's range token (exactly-once commits)
    delivery: str = "at_least_once"
    records_written: int | None = None
    bytes_written: int | None = None
    batches: int | None = None
    retry_count: int = 0
    fetch_ms: float | None = None
    decode_ms: float | None = None
    flush_ms: float | None = None
    commit_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def records_read(self) -> int | None:
        return self.rows

    @property
    def bytes_read(self) -> int | None:
        return self.bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        d["records_read"], d["bytes_read"] = self.rows, self.bytes
        return d


def ms_since(t: float) -> float:
    return round((time.monotonic() - t) * 1000, 3)
