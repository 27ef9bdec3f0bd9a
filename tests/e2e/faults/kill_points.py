"""Where the exactly-once fault jobs kill their own process: SIGKILL, so no `finally` or atexit runs.

`sink`: the run's output is being written and the process dies before it is committed: with Spark
(`engine="spark"`) the files are staged, not published; without (`engine="arrow"`, the consume
path) the first partition stream's Parquet file is in place and the others are not written.
`commit`: the output is committed and the process dies instead of storing the watermark.
`stored`: the caller dies after the run returned (the watermark is stored).
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
    from pyspark_rmqs import consume, jobs

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
    elif kill == "commit":
        jobs.store_watermarks_checked = lambda *a, **k: die()  # type: ignore[assignment]
