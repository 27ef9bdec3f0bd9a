"""What batch and streaming reads share: the input partition and the executor-side read.

The executor-side read reports the time its `RangeReader` measured (fetching chunks, decoding them
into Arrow) to the driver when the job that runs it asked for it: the driver sets the Spark local
property `METRICS_PROPERTY` to the id of an accumulator of `ReadMetrics` (the run protocol's
`ExecutorReadMetrics` does), Spark hands local properties to every task, and each task adds its numbers to
that accumulator; Spark sends them back with the task's result. No property, nothing is reported.

Spark drops the accumulator updates of a data source it found by itself (the `pyspark_*` module
scan): its function carries no accumulator. `source.register_for_metrics` registers the source in
the session once, through `spark.dataSource.register`, whose function carries the SparkContext's;
Spark logs once that it "replaced a statically registered data source" (the same class). It lives
in `source.py`, not here: the readers import this module, and `source.py` imports the readers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.accumulators import AccumulatorParam
from pyspark.sql.datasource import InputPartition

from pyspark_rmqs.core.offsets import OffsetRange
from pyspark_rmqs.options import SourceOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from pyspark_rmqs.broker.reader import RangeReader, ReadSettings

log = logging.getLogger(__name__)


@dataclass
class RangePartition(InputPartition):
    """One Spark task: offsets [start, end) of one partition stream. Carries no secrets of its own."""

    stream: str
    start: int
    end: int
    split: int = 0

    def __init__(self, stream: str, start: int, end: int, split: int = 0) -> None:  # InputPartition has one
        super().__init__((stream, start, end))
        self.stream, self.start, self.end, self.split = stream, start, end, split


def to_partitions(ranges: list[OffsetRange]) -> list[RangePartition]:
    counts: dict[str, int] = {}
    parts = []
    for r in ranges:
        if r.end > r.start:
            parts.append(RangePartition(r.stream, r.start, r.end, counts.get(r.stream, 0)))
            counts[r.stream] = counts.get(r.stream, 0) + 1
    return parts


def read_settings(opts: SourceOptions) -> ReadSettings:
    """The executor's reader settings: the options' (`SourceOptions.reader_settings`) and the post filter."""
    # Here, not at module level: start-up cost of Spark's per-query Python process (it only plans).
    from pyspark_rmqs.broker.reader import ReadSettings

    post = None
    if opts.filter_post_filter_class:
        post = _post_filter(opts.filter_post_filter_class)
    return ReadSettings(**opts.reader_settings(), post_filter=post)


def _post_filter(path: str) -> Callable[[Any], bool]:
    from pyspark_rmqs.core import codec
    from pyspark_rmqs.core.extensions import MessageView, PostFilter, load
    from pyspark_rmqs.core.schema import PROPERTY_NAMES

    impl = load(path, SourceOptions.alias("filter_post_filter_class"), PostFilter)

    def matches(d: codec.Decoded) -> bool:
        props = dict(zip(PROPERTY_NAMES, d.properties or [], strict=False))
        view = MessageView(
            d.body,
            {k: v for k, v in props.items() if v is not None},
            {str(codec.to_text(k)): v for k, v in (d.application_properties or {}).items()},
            {str(codec.to_text(k)): v for k, v in (d.message_annotations or {}).items()},
        )
        return bool(impl.matches(view))

    return matches


# A Spark local property: the id of the accumulator (of `ReadMetrics`) the tasks of a job add to.
METRICS_PROPERTY = "pyspark_rmqs.read.metricsAccumulator"


class ReadMetrics(AccumulatorParam[dict[str, float]]):
    """Sums what the tasks' readers measured: `fetch_ms`, `decode_ms`, `chunks`, `readers`."""

    def zero(self, value: dict[str, float]) -> dict[str, float]:
        return {}

    def addInPlace(self, value1: dict[str, float], value2: dict[str, float]) -> dict[str, float]:
        for k, v in value2.items():
            value1[k] = value1.get(k, 0) + v
        return value1


def read_partition(opts: SourceOptions, partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """Executor side: Arrow batches of exactly [start, end) of one stream."""
    # Here, not at module level: start-up cost of Spark's per-query Python process (it only plans).
    from pyspark_rmqs.broker.reader import RangeReader
    from pyspark_rmqs.core.batches import value_bytes

    reader = RangeReader(
        opts.connection, partition.stream, partition.start, partition.end, read_settings(opts)
    )
    nbytes = 0
    try:
        for batch in reader:
            nbytes += value_bytes(batch)
            yield batch
    finally:
        try:
            _report(reader, nbytes)
        except Exception:  # metrics never fail a read (nor hide why it failed)
            log.debug("reporting the read's metrics failed", exc_info=True)


def _report(reader: RangeReader, nbytes: int) -> None:
    """Add the reader's measured times to the job's metrics accumulator, if the job set one."""
    from pyspark import TaskContext

    from pyspark_rmqs.spark.compat import task_accumulator

    tc = TaskContext.get()
    aid = tc.getLocalProperty(METRICS_PROPERTY) if tc is not None else None
    if not aid:
        return
    acc = task_accumulator(int(aid), {}, ReadMetrics())
    acc.add(
        {
            "fetch_ms": reader.fetch_s * 1000,
            "decode_ms": reader.decode_s * 1000,
            "chunks": reader.chunks,
            "bytes": nbytes,
            "readers": 1,
        }
    )
