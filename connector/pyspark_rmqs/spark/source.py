"""`RabbitMQStreamsDataSource`: the `rabbitmq_streams` format for spark.read / readStream / write."""

from __future__ import annotations

import weakref
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.schema import source_ddl
from pyspark_rmqs.options import parse_sink_options, parse_source_options
from pyspark_rmqs.spark.compat import pushdown_enabled


class RabbitMQStreamsDataSource(DataSource):
    """RabbitMQ Streams and Super Streams as a Spark data source (batch and streaming)."""

    @classmethod
    def name(cls) -> str:
        return "rabbitmq_streams"

    def schema(self) -> str:
        # Options are validated again, for the right mode, by each reader and writer.
        opts = parse_source_options(dict(self.options), streaming=False)
        return source_ddl(opts.metadata_fields)

    def reader(self, schema: StructType) -> DataSourceReader:
        from pyspark_rmqs.spark.batch import RabbitMQStreamsBatchReader, RabbitMQStreamsFilteringBatchReader

        opts = parse_source_options(dict(self.options), streaming=False)
        if pushdown_enabled():
            return RabbitMQStreamsFilteringBatchReader(opts)
        return RabbitMQStreamsBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pyspark_rmqs.spark.streaming import RabbitMQStreamsStreamReader

        return RabbitMQStreamsStreamReader(parse_source_options(dict(self.options), streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pyspark_rmqs.spark.sink import RabbitMQStreamsWriter, check_sink_schema

        _append_only(overwrite)
        opts = parse_sink_options(dict(self.options))
        return RabbitMQStreamsWriter(opts, check_sink_schema(schema, opts))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pyspark_rmqs.spark.sink import RabbitMQStreamsStreamWriter, check_sink_schema

        _append_only(overwrite)
        opts = parse_sink_options(dict(self.options))
        return RabbitMQStreamsStreamWriter(opts, check_sink_schema(schema, opts))


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise ConfigurationError(
            "rabbitmq_streams writes append only: a stream cannot be overwritten or truncated; "
            "use mode('append') (or outputMode('append') for streaming)"
        )


_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def register_for_metrics(spark: Any) -> None:
    """Register `rabbitmq_streams` in `spark` (once per session): its tasks' accumulators reach the driver.

    Spark drops the accumulator updates of a data source it found by itself (the `pyspark_*`
    module scan); one registered through `spark.dataSource.register` carries the SparkContext's
    (`common.py` says how the tasks report).
    """
    if spark in _REGISTERED:
        return
    spark.dataSource.register(RabbitMQStreamsDataSource)
    _REGISTERED.add(spark)
