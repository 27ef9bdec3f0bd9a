"""Event-driven ingest: an AssetWatcher on the new-data trigger schedules a read per arrival.

The triggerer polls the super stream's tails against the consumer's watermark (metadata only) and
emits an asset event when messages arrive after it; each run reads them into Parquet and advances
the watermark. Environment: RMQS_DEMO_SUPERSTREAM [orders], RMQS_DEMO_OUTPUT [demo-output/orders]
(this DAG writes to `<output>-events`), RMQS_DEMO_EVENTS_CONSUMER [rmqs-demo-events],
RMQS_DEMO_BROKER [localhost:5552] and RMQS_DEMO_VHOST [/] (for the asset URI),
RMQS_DEMO_CONN_ID [rabbitmq_stream_default].
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_rmqs.assets import asset_uri
from airflow_rmqs.operators import RabbitMQStreamReadOperator
from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger

SUPERSTREAM = os.environ.get("RMQS_DEMO_SUPERSTREAM", "orders")
OUTPUT = os.path.abspath(os.environ.get("RMQS_DEMO_OUTPUT", "demo-output/orders")) + "-events"
CONSUMER = os.environ.get("RMQS_DEMO_EVENTS_CONSUMER", "rmqs-demo-events")
CONN_ID = os.environ.get("RMQS_DEMO_CONN_ID", "rabbitmq_stream_default")
HOST, _, PORT = os.environ.get("RMQS_DEMO_BROKER", "localhost:5552").partition(":")

new_orders = Asset(
    name="rmqs_new_orders",
    uri=asset_uri(
        host=HOST, port=int(PORT or 5552), vhost=os.environ.get("RMQS_DEMO_VHOST", "/"), stream=SUPERSTREAM
    ),
    watchers=[
        AssetWatcher(
            name="rmqs_new_orders_watcher",
            trigger=RabbitMQStreamNewDataTrigger(
                superstream=SUPERSTREAM,
                consumer_name=CONSUMER,
                min_messages=1,
                poll_interval=5.0,
                rabbitmq_stream_conn_id=CONN_ID,
            ),
        )
    ],
)

with DAG(
    dag_id="rmqs_event_driven",
    schedule=[new_orders],
    start_date=datetime(2025, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["rmqs", "example"],
) as dag:
    RabbitMQStreamReadOperator(
        task_id="read_new_orders",
        superstream=SUPERSTREAM,
        consumer_name=CONSUMER,
        output_path=OUTPUT,
        rabbitmq_stream_conn_id=CONN_ID,
        retries=2,
    )
