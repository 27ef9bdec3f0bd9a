"""The demo's Dagster definitions: drain a super stream into Parquet whenever it has new data.

    RMQS_URI=rabbitmq-stream://user:pass@host:5552/%2F  dagster dev -m dagster_rmqs.examples.definitions

Environment: RMQS_URI (connection; read through EnvVar, so the UI shows the name, not the password),
RMQS_PASSWORD (optional, when the URI carries none), RMQS_DEMO_SUPERSTREAM (default "orders"),
RMQS_DEMO_OUTPUT (default "demo-output/dagster/orders"), SPARK_REMOTE (optional Spark Connect URL).
"""

import os

from dagster import Backoff, DefaultSensorStatus, Definitions, EnvVar, RetryPolicy

from dagster_rmqs import (
    RabbitMQStreamsResource,
    SparkSessionResource,
    build_lag_check,
    build_new_data_sensor,
    build_observation_sensor,
    build_stream_asset,
    stream_asset_spec,
)

SUPERSTREAM = os.environ.get("RMQS_DEMO_SUPERSTREAM", "orders")
OUTPUT = os.environ.get("RMQS_DEMO_OUTPUT", "demo-output/dagster/orders")
CONSUMER = "dagster-orders"
LOCAL_URI = "rabbitmq-stream://guest@localhost:5552/%2F"  # the local broker (password 'guest')


def rabbitmq_resource() -> RabbitMQStreamsResource:
    """The connection from RMQS_URI (and RMQS_PASSWORD), else the local broker."""
    uris = EnvVar("RMQS_URI") if os.environ.get("RMQS_URI") else LOCAL_URI
    password = EnvVar("RMQS_PASSWORD") if os.environ.get("RMQS_PASSWORD") else "guest"
    return RabbitMQStreamsResource(uris=uris, password=password)


orders_stream = stream_asset_spec("orders_stream", superstream=SUPERSTREAM, consumer_name=CONSUMER)

orders = build_stream_asset(
    "orders",
    superstream=SUPERSTREAM,
    consumer_name=CONSUMER,
    output_path=OUTPUT,
    output_format="parquet",
    deps=[orders_stream],
    retry_policy=RetryPolicy(max_retries=3, delay=5, backoff=Backoff.EXPONENTIAL),
    description=f"Orders from super stream '{SUPERSTREAM}' as Parquet under {OUTPUT}",
)

defs = Definitions(
    assets=[orders_stream, orders],
    asset_checks=[build_lag_check(orders, max_lag=100_000)],
    sensors=[
        build_new_data_sensor(orders, min_messages=1, default_status=DefaultSensorStatus.RUNNING),
        build_observation_sensor(orders_stream),
    ],
    resources={
        "rabbitmq": rabbitmq_resource(),
        "spark": SparkSessionResource(remote=os.environ.get("SPARK_REMOTE") or None),
    },
)
