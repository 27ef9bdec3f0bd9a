"""Hourly ingest: wait for new data -> read it into Parquet -> gate on consumer lag -> downstream.

The read follows the watermark protocol: it reads `[watermark + 1, tail)` fixed at task start,
writes Parquet, and only then stores the new watermark, so a failed or retried run re-reads the
same range. Configure with environment variables (defaults in brackets):
RMQS_DEMO_SUPERSTREAM [orders], RMQS_DEMO_OUTPUT [demo-output/orders], RMQS_DEMO_CONSUMER
[rmqs-demo-ingest], RMQS_DEMO_MAX_LAG [1000], RMQS_DEMO_DEFERRABLE [true], RMQS_DEMO_POKE_INTERVAL
[5], RMQS_DEMO_SENSOR_TIMEOUT [600], RMQS_DEMO_CONN_ID [rabbitmq_stream_default] (define the
connection as AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT='rabbitmq-stream://guest:guest@localhost:5552/%2F').
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, task

from airflow_rmqs.operators import RabbitMQStreamReadOperator
from airflow_rmqs.sensors import RabbitMQStreamLagSensor, RabbitMQStreamNewDataSensor

SUPERSTREAM = os.environ.get("RMQS_DEMO_SUPERSTREAM", "orders")
OUTPUT = os.path.abspath(os.environ.get("RMQS_DEMO_OUTPUT", "demo-output/orders"))
CONSUMER = os.environ.get("RMQS_DEMO_CONSUMER", "rmqs-demo-ingest")
CONN_ID = os.environ.get("RMQS_DEMO_CONN_ID", "rabbitmq_stream_default")
DEFERRABLE = os.environ.get("RMQS_DEMO_DEFERRABLE", "true").lower() == "true"
POKE = float(os.environ.get("RMQS_DEMO_POKE_INTERVAL", "5"))
SENSOR_TIMEOUT = float(os.environ.get("RMQS_DEMO_SENSOR_TIMEOUT", "600"))

with DAG(
    dag_id="rmqs_ingest",
    schedule="@hourly",
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,  # one reader per watermark at a time
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    tags=["rmqs", "example"],
) as dag:
    new_data = RabbitMQStreamNewDataSensor(
        task_id="wait_for_new_data",
        superstream=SUPERSTREAM,
        consumer_name=CONSUMER,
        min_messages=1,
        rabbitmq_stream_conn_id=CONN_ID,
        deferrable=DEFERRABLE,
        poke_interval=POKE,
        timeout=SENSOR_TIMEOUT,
    )
    read = RabbitMQStreamReadOperator(
        task_id="read_to_parquet",
        superstream=SUPERSTREAM,
        consumer_name=CONSUMER,
        output_path=OUTPUT,
        output_format="parquet",
        rabbitmq_stream_conn_id=CONN_ID,
    )
    lag_gate = RabbitMQStreamLagSensor(
        task_id="lag_gate",
        superstream=SUPERSTREAM,
        consumer_name=CONSUMER,
        max_lag=int(os.environ.get("RMQS_DEMO_MAX_LAG", "1000")),
        rabbitmq_stream_conn_id=CONN_ID,
        deferrable=DEFERRABLE,
        poke_interval=POKE,
        timeout=SENSOR_TIMEOUT,
    )

    @task
    def report(summary: dict[str, Any]) -> dict[str, Any]:
        """Downstream work: here, a one-line report of what the read did."""
        print(f"read {summary['rows']} rows of '{summary['target']}', lag after: {summary['lag_after']}")
        return {"rows": summary["rows"], "output": OUTPUT}

    new_data >> read >> lag_gate >> report(read.output)
