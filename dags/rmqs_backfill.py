"""Backfill: re-read an explicit offset or time range without touching the live watermark.

Trigger with a conf, e.g. `{"start": {"orders-0": 0, "orders-1": 0}, "end": "latest"}` or
`{"start": "2025-01-01T00:00:00+00:00", "end": "2025-01-01T01:00:00+00:00"}`. `start` and `end`
accept "earliest" / "latest", per-partition offsets (`{"orders-0": 1200}`, next offsets), or an
ISO-8601 timestamp (mapped to offsets per partition by chunk timestamp), such as a run's
`{{ data_interval_start }}`. By default the whole retained stream is re-read. Environment:
RMQS_DEMO_SUPERSTREAM [orders], RMQS_DEMO_OUTPUT [demo-output/orders] (this DAG writes to
`<output>-backfill`), RMQS_DEMO_CONN_ID [rabbitmq_stream_default].
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_rmqs.operators import RabbitMQStreamReadOperator

SUPERSTREAM = os.environ.get("RMQS_DEMO_SUPERSTREAM", "orders")
OUTPUT = os.path.abspath(os.environ.get("RMQS_DEMO_OUTPUT", "demo-output/orders")) + "-backfill"
CONN_ID = os.environ.get("RMQS_DEMO_CONN_ID", "rabbitmq_stream_default")

with DAG(
    dag_id="rmqs_backfill",
    schedule=None,
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["rmqs", "example"],
    params={
        "start": Param(
            "earliest",
            type=["string", "object"],
            description="earliest | offsets {stream: next offset} | ISO-8601 timestamp",
        ),
        "end": Param(
            "latest",
            type=["string", "object"],
            description="latest | offsets {stream: next offset} | ISO-8601 timestamp",
        ),
        "output_path": Param(OUTPUT, type="string", description="where the rows go (Parquet)"),
        "output_mode": Param("overwrite", enum=["overwrite", "append"], description="Spark save mode"),
    },
) as dag:
    RabbitMQStreamReadOperator(
        task_id="backfill_range",
        superstream=SUPERSTREAM,
        start="{{ params.start | tojson if params.start is mapping else params.start }}",
        end="{{ params.end | tojson if params.end is mapping else params.end }}",
        output_path="{{ params.output_path }}",
        output_mode="{{ params.output_mode }}",
        store_watermark=False,  # a backfill leaves the live watermark alone
        rabbitmq_stream_conn_id=CONN_ID,
    )
