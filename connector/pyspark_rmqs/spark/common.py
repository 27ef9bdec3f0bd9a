"""What batch and streaming reads share: the input partition and the executor-side read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.offsets import OffsetRange
from pyspark_rmqs.options import SourceOptions


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
    post = None
    if opts.filter_post_filter_class:
        post = _post_filter(opts.filter_post_filter_class)
    return ReadSettings(**opts.reader_settings(), post_filter=post)


def _post_filter(path: str) -> Callable[[Any], bool]:
    from pyspark_rmqs import codec
    from pyspark_rmqs.extensions import MessageView, PostFilter, load
    from pyspark_rmqs.schema import PROPERTY_NAMES

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


def read_partition(opts: SourceOptions, partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """Executor side: Arrow batches of exactly [start, end) of one stream."""
    yield from RangeReader(
        opts.connection, partition.stream, partition.start, partition.end, read_settings(opts)
    )
