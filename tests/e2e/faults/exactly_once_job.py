"""A watermark run (Spark read into Parquet, exactly-once) that kills its own process at a chosen point.

    python -m tests.e2e.faults.exactly_once_job CONFIG_JSON

CONFIG_JSON: {"endpoints", "username", "password", "vhost", "stream", "consumer", "out", "kill"},
`kill` one of `sink` (the files are being written: staged, not yet published), `commit` (the commit
record is written, the watermark not yet stored) or `stored` (the watermark is stored). The process
sends itself SIGKILL there: no `finally`, no atexit, exactly what a lost worker or OOM kill leaves.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from tests.e2e.faults.spark_job import session


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main(cfg: dict[str, Any]) -> None:
    from pyspark_rmqs import jobs
    from pyspark_rmqs.options import parse_connection_options

    conn = parse_connection_options({k: cfg[k] for k in ("endpoints", "username", "password", "vhost")})
    kill = cfg["kill"]
    if kill == "sink":
        real_write = jobs.FileOutput.write_to

        def write_then_die(self: Any, df: Any, path: str, mode: str) -> None:
            real_write(self, df, path, mode)
            _die()  # the staged files are complete; the publish never happens

        jobs.FileOutput.write_to = write_then_die  # type: ignore[method-assign]
    elif kill == "commit":

        def die_before_store(*a: Any, **k: Any) -> None:
            _die()

        jobs.store_watermarks_checked = die_before_store  # type: ignore[assignment]
    spark = session("local[2]")
    plan = jobs.plan_read(conn, stream=cfg["stream"], consumer=cfg["consumer"])
    jobs.run_read(spark, conn, plan, jobs.write_output(cfg["out"]))
    if kill == "stored":
        _die()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
