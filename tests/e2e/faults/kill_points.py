"""Where the exactly-once fault jobs kill their own process: SIGKILL, so no `finally` or atexit runs.

`sink`: the run's output is being written and the process dies before it is committed: with Spark
(`engine="spark"`) the files are staged, not published; without (`engine="arrow"`, the consume
path) the first partition stream's Parquet file is in place and the others are not written.
`commit`: the output is committed and the process dies instead of storing the watermark.
`stored`: the caller dies after the run returned (the watermark is stored).

The Spark-free path has three more (`engine="arrow"`), which the object-store tests use:
`writing`: inside the first range's file, after its first batch (an upload not completed);
`manifest`: every range's file complete, the commit record (the manifest) not written;
`delivered`: the commit record written, the run record not yet moved to `delivered`.
`table`: an Iceberg run's data files written, its table commit not made.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kill: str, *, engine: str = "spark") -> None:
    """Make the watermark protocol die at `kill` (`sink` as the Spark or the Arrow file output writes)."""
    from pyspark_rmqs import jobs
    from pyspark_rmqs.runs import consume, steps

    if kill == "sink" and engine == "spark":
        real_write = jobs.FileOutput.write_to

        def write_then_die(self: Any, df: Any, path: str, mode: str) -> None:
            real_write(self, df, path, mode)
            die()

        jobs.FileOutput.write_to = write_then_die  # type: ignore[method-assign]
    elif kill == "sink" and engine == "arrow":
        real_close = consume.ParquetSink.close

        def close_then_die(self: Any) -> None:
            real_close(self)
            die()

        consume.ParquetSink.close = close_then_die  # type: ignore[method-assign]
    elif kill == "writing" and engine == "arrow":
        real_write = consume.ParquetSink.write

        def write_then_die(self: Any, batch: Any) -> None:
            real_write(self, batch)
            die()

        consume.ParquetSink.write = write_then_die  # type: ignore[method-assign]
    elif kill == "manifest" and engine == "arrow":
        from pyspark_rmqs.runs.outputs import delivery

        delivery.StoreCommits.commit = lambda *a, **k: die()  # type: ignore[method-assign]
        delivery.FileCommits.commit = lambda *a, **k: die()  # type: ignore[method-assign]
    elif kill == "table":
        from pyspark_rmqs.runs.outputs.iceberg import IcebergSink

        real_commit = IcebergSink.commit_run

        def flush_then_die(self: Any) -> None:
            self._flush()  # the data files are written to the warehouse; no snapshot names them
            die()

        IcebergSink.commit_run = flush_then_die  # type: ignore[method-assign]
        del real_commit
    elif kill == "delivered":
        from pyspark_rmqs.runs import record

        real_advance = record.advance

        def advance_unless_delivered(conn: Any, rec: Any, state: str, **kw: Any) -> Any:
            if state == record.DELIVERED:
                die()
            return real_advance(conn, rec, state, **kw)

        record.advance = advance_unless_delivered  # type: ignore[assignment]
    elif kill == "commit":
        steps.store_watermarks_checked = lambda *a, **k: die()  # type: ignore[assignment]
