"""Where the exactly-once fault jobs kill their own process: SIGKILL, so no `finally` or atexit runs.

`sink`: the run's files are written (staged) and the process dies before they are published.
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


def arm(kill: str) -> None:
    """Make the watermark protocol die at `kill` (`sink` as the Spark file output writes)."""
    from pyspark_rmqs import jobs

    if kill == "sink":
        real_write = jobs.FileOutput.write_to

        def write_then_die(self: Any, df: Any, path: str, mode: str) -> None:
            real_write(self, df, path, mode)
            die()

        jobs.FileOutput.write_to = write_then_die  # type: ignore[method-assign]
    elif kill == "commit":
        jobs.store_watermarks_checked = lambda *a, **k: die()  # type: ignore[assignment]
