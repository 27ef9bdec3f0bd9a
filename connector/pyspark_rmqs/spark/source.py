"""`RabbitMQStreamsDataSource`: the `rabbitmq_streams` format for spark.read / readStream / write."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
)
from pyspark.sql.types import StructType

from pyspark_rmqs.options import parse_source_options
from pyspark_rmqs.schema import source_ddl


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
        from pyspark_rmqs.spark.batch import RabbitMQStreamsBatchReader

        return RabbitMQStreamsBatchReader(parse_source_options(dict(self.options), streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pyspark_rmqs.spark.streaming import RabbitMQStreamsStreamReader

        return RabbitMQStreamsStreamReader(parse_source_options(dict(self.options), streaming=True))
