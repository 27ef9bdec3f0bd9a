"""A watermark run (Spark read into Parquet, exactly-once) that kills its own process at a chosen point.

    python -m tests.e2e.faults.exactly_once_job CONFIG_JSON

CONFIG_JSON: {"endpoints", "username", "password", "vhost", "stream", "consumer", "out", "kill"},
`kill` one of `sink` (the files are being written: staged, not yet published), `commit` (the commit
record is written, the watermark not yet stored) or `stored` (the watermark is stored). The process
sends itself SIGKILL there: no `finally`, no atexit, exactly what a lost worker or OOM kill leaves.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.e2e.faults.kill_points import arm, die
from tests.e2e.faults.spark_job import session


def main(cfg: dict[str, Any]) -> None:
    from pyspark_rmqs import jobs
    from pyspark_rmqs.options import parse_connection_options

    conn = parse_connection_options({k: cfg[k] for k in ("endpoints", "username", "password", "vhost")})
    kill = cfg["kill"]
    arm(kill)
    spark = session("local[2]")
    plan = jobs.plan_read(conn, stream=cfg["stream"], consumer=cfg["consumer"])
    jobs.run_read(spark, conn, plan, jobs.write_output(cfg["out"]))
    if kill == "stored":
        die()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
