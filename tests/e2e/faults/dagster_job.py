"""A Dagster stream asset run (Spark, exactly-once Parquet) that kills its own process at a chosen point.

    python -m tests.e2e.faults.dagster_job CONFIG_JSON

CONFIG_JSON: {"endpoints", "stream", "consumer", "out", "kill"} with `kill` one of `sink` (files staged,
not published), `commit` (commit record written, watermark not stored) or `stored` (after the store).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.e2e.faults.kill_points import arm, die
from tests.e2e.faults.spark_job import session


def main(cfg: dict[str, Any]) -> None:
    from dagster import materialize

    from dagster_rmqs import RabbitMQStreamsResource, build_stream_asset

    kill = cfg["kill"]
    arm(kill)
    asset = build_stream_asset(
        "eo", stream=cfg["stream"], consumer_name=cfg["consumer"], output_path=cfg["out"]
    )
    result = materialize(
        [asset],
        resources={
            "rabbitmq": RabbitMQStreamsResource(endpoints=cfg["endpoints"]),
            "spark": session("local[2]"),
        },
    )
    assert result.success
    if kill == "stored":
        die()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
