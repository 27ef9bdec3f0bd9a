"""One try of an Airflow task (the read or the consume operator's `execute`) in a process of its own.

    python -m tests.e2e.faults.airflow_job CONFIG_JSON

CONFIG_JSON: {"operator": "read" | "consume", "conn_id", "consumer", "out", "kill", "try_number"} and
"stream" or "superstream"; optionally "output_conn_id" (the consume operator's output credentials).
The Airflow connections come from the environment (`AIRFLOW_CONN_<CONN_ID>`), as a worker's
secrets backend would give them. `kill` is a point of
`kill_points` (`sink`, `commit`, `stored`), where the task process sends itself SIGKILL, or `none`:
the try runs to its end and prints its XCom value (the run summary) as JSON after `XCOM`.
The context holds a task instance with the DAG and task ids and the try number, as Airflow's does.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

from tests.e2e.faults.kill_points import arm, die

DAG_ID = "rmqs_faults"
XCOM = "XCOM:"  # the line of stdout holding the XCom value (Spark may print there too)


def operator(cfg: dict[str, Any]) -> Any:
    from airflow_rmqs.operators import RabbitMQStreamConsumeOperator, RabbitMQStreamReadOperator

    target = {k: cfg[k] for k in ("stream", "superstream") if cfg.get(k)}
    common = {
        "task_id": cfg["operator"],
        "rabbitmq_stream_conn_id": cfg["conn_id"],
        "consumer_name": cfg["consumer"],
        "output_path": cfg["out"],
        "metadata_fields": "",
        **target,
    }
    if cfg["operator"] == "read":
        conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        return RabbitMQStreamReadOperator(spark_master="local[2]", spark_conf=conf, **common)
    return RabbitMQStreamConsumeOperator(output_conn_id=cfg.get("output_conn_id"), **common)


def main(cfg: dict[str, Any]) -> None:
    kill = cfg["kill"]
    if kill != "none":
        arm(kill, engine="spark" if cfg["operator"] == "read" else "arrow")
    op = operator(cfg)
    ti = SimpleNamespace(dag_id=DAG_ID, task_id=op.task_id, try_number=cfg["try_number"])
    xcom = op.execute({"ti": ti})
    if kill == "stored":
        die()
    print(XCOM, json.dumps(xcom, default=str), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
