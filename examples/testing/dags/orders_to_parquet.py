"""A user's DAG: new messages of a stream into Parquet files, under the watermark protocol.

The stream comes from ORDERS_STREAM (the test gives it a fresh one), the folder from ORDERS_OUTPUT.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_rmqs.operators import RabbitMQStreamConsumeOperator

with DAG(dag_id="orders_to_parquet", schedule=None, start_date=datetime(2025, 1, 1), catchup=False) as dag:
    RabbitMQStreamConsumeOperator(
        task_id="consume",
        stream=os.environ.get("ORDERS_STREAM", "orders"),
        consumer_name="orders-to-parquet",
        output_path=os.environ.get("ORDERS_OUTPUT", "/lake/orders"),
    )
