"""Batch reads: offsets resolved once at planning; one task per partition stream or per split."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.positions import (
    bounds,
    check_version,
    clamp_to_retention,
    ending_offsets,
    partition_streams,
    starting_offsets,
)
from pyspark_rmqs.core import offsets as off
from pyspark_rmqs.options import SourceOptions
from pyspark_rmqs.spark.common import RangePartition, read_partition, to_partitions
from pyspark_rmqs.spark.pushdown import Pushed, apply, push

log = logging.getLogger(__name__)


class RabbitMQStreamsBatchReader(DataSourceReader):
    """Batch reader without filter pushdown (Spark refuses a reader with `pushFilters` when
    `spark.sql.python.filterPushdown.enabled` is false, its default)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.pushed = Pushed()

    def plan(self) -> list[off.OffsetRange]:
        """Start and end per partition stream, resolved once; filters and minPartitions applied."""
        opts = self.opts
        client = BrokerClient(opts.connection)
        check_version(client, opts)
        streams = partition_streams(client, opts)
        if self.pushed.streams is not None:
            streams = [s for s in streams if s in self.pushed.streams]
        b = bounds(client, streams, opts.fail_on_data_loss)
        starts = clamp_to_retention(starting_offsets(client, opts, b), b, opts.fail_on_data_loss)
        ends = ending_offsets(opts, b)
        starts, ends = apply(starts, ends, self.pushed, client.offset_for_timestamp)
        ranges = off.plan_ranges(starts, ends)
        return off.split_ranges(ranges, opts.min_partitions)

    def partitions(self) -> Sequence[InputPartition]:
        parts = to_partitions(self.plan())
        log.info("rabbitmq_streams batch read of '%s': %d partition(s)", self.opts.name, len(parts))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangePartition):  # Spark adds an InputPartition(None) to an empty plan
            yield from read_partition(self.opts, partition)


class RabbitMQStreamsFilteringBatchReader(RabbitMQStreamsBatchReader):
    """Batch reader with filter pushdown on `offset`, `stream` and `chunk_timestamp`."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        return list(push(filters, self.pushed))
