"""Dagster integration of rmqs: read RabbitMQ Streams as assets, under the watermark protocol.

Resources `RabbitMQStreamsResource` (default key `rabbitmq`), `SparkSessionResource` (default
key `spark`; any SparkSession or resource exposing one works too) and `ObjectStoreResource` (an
object store's credentials, `output_storage_key`); factories `build_stream_asset`
(watermark runs, AvailableNow drains, offset-range or time-window partitions; Spark or Arrow
engine), `build_new_data_sensor`, `build_lag_check`, `build_observation_sensor`; offset-range
partitions (`offset_range_partitions` and key helpers); the YAML component `RabbitMQStreamComponent`;
`produce_run_identity` (a produce run's identity for the resource's `publish`).

A Dagster older than rmqs supports fails here, on import, naming the version it needs and why
(`pyspark_rmqs.core.versions`).
"""

from pyspark_rmqs.core.versions import DAGSTER, require

require(DAGSTER)

from dagster_rmqs.assets import (  # noqa: E402 (after the version check)
    StreamTarget,
    build_stream_asset,
    consumer_pool,
    stream_asset_spec,
    stream_target,
)
from dagster_rmqs.checks import build_lag_check  # noqa: E402
from dagster_rmqs.components import RabbitMQStreamComponent  # noqa: E402
from dagster_rmqs.partitions import (  # noqa: E402
    OffsetRange,
    merge_offset_ranges,
    offset_range_key,
    offset_range_partitions,
    parse_offset_range_key,
    range_layers,
    range_run_key,
)
from dagster_rmqs.resources import (  # noqa: E402
    ObjectStoreResource,
    RabbitMQStreamsResource,
    SparkSessionResource,
    produce_run_identity,
)
from dagster_rmqs.sensors import build_new_data_sensor, build_observation_sensor, evaluate_new_data  # noqa: E402
from pyspark_rmqs import __version__  # noqa: E402 (the one version source)

__all__ = [
    "ObjectStoreResource",
    "OffsetRange",
    "RabbitMQStreamComponent",
    "RabbitMQStreamsResource",
    "SparkSessionResource",
    "StreamTarget",
    "__version__",
    "build_lag_check",
    "build_new_data_sensor",
    "build_observation_sensor",
    "build_stream_asset",
    "consumer_pool",
    "evaluate_new_data",
    "merge_offset_ranges",
    "offset_range_key",
    "offset_range_partitions",
    "parse_offset_range_key",
    "produce_run_identity",
    "range_layers",
    "range_run_key",
    "stream_asset_spec",
    "stream_target",
]
