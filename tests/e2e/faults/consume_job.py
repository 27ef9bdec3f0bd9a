"""A Spark-free watermark run (consume into Parquet) that kills its own process at a chosen point.

    python -m tests.e2e.faults.consume_job CONFIG_JSON

CONFIG_JSON: {"endpoints", "username", "password", "vhost", "superstream", "consumer", "out", "kill"};
`kill`: `sink` (after the first partition stream's file is in place, the others not written),
`commit` (after the commit record, before the watermark store) or `stored` (after the store).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.e2e.faults.kill_points import arm, die


def main(cfg: dict[str, Any]) -> None:
    from pyspark_rmqs import consume, jobs
    from pyspark_rmqs.options import parse_connection_options

    conn = parse_connection_options({k: cfg[k] for k in ("endpoints", "username", "password", "vhost")})
    kill = cfg["kill"]
    arm(kill, engine="arrow")
    plan = jobs.plan_read(conn, superstream=cfg["superstream"], consumer=cfg["consumer"])
    consume.run_consume(conn, plan, consume.ParquetSink(cfg["out"]))
    if kill == "stored":
        die()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
