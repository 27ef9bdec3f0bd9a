"""Offset-range partitions: one dynamic partition per `[start, end)` range of one partition stream.

A key reads `orders-0:000000001200-000000001500`: the partition stream, then start and end offsets
(end exclusive), zero-padded to 12 digits so keys of one stream sort by offset as text (up to 10^12;
wider offsets still parse). Keys hold no comma, so a list of them joins with commas (run keys).
The new-data sensor adds keys as data arrives; a single-run backfill reads the union of the selected
keys in one Spark job (`range_layers`).
"""

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from dagster import DynamicPartitionsDefinition

from pyspark_rmqs.errors import ConfigurationError

OFFSET_DIGITS = 12
_KEY = re.compile(r"(?P<stream>.+):(?P<start>\d+)-(?P<end>\d+)")
_FORBIDDEN = (",", "...", "\n", "\r", "\t", "\0")


class OffsetRange(NamedTuple):
    """`[start, end)` of one partition stream (end exclusive, like the offsets JSON's next offsets)."""

    stream: str
    start: int
    end: int

    @property
    def key(self) -> str:
        return offset_range_key(self.stream, self.start, self.end)

    @property
    def size(self) -> int:
        return self.end - self.start


def offset_range_partitions(name: str) -> DynamicPartitionsDefinition:
    """The dynamic partitions of an offset-range partitioned stream asset (keys added by the sensor)."""
    return DynamicPartitionsDefinition(name=name)


def offset_range_key(stream: str, start: int, end: int) -> str:
    """The partition key of `[start, end)` of `stream`; fails on a name or range a key cannot hold."""
    bad = [s for s in _FORBIDDEN if s in stream]
    if not stream or bad:
        raise ConfigurationError(
            f"stream name {stream!r} cannot be part of an offset-range partition key (contains {bad})"
        )
    if not 0 <= start < end:
        raise ConfigurationError(
            f"an offset range needs 0 <= start < end; got [{start}, {end}) of '{stream}'"
        )
    return f"{stream}:{start:0{OFFSET_DIGITS}d}-{end:0{OFFSET_DIGITS}d}"


def parse_offset_range_key(key: str) -> OffsetRange:
    """The inverse of `offset_range_key`; a ConfigurationError names the key and the expected form."""
    m = _KEY.fullmatch(key)
    if m is None or int(m["end"]) <= int(m["start"]):
        raise ConfigurationError(
            f"partition key {key!r} is not an offset range; expected '<stream>:<start>-<end>' with "
            f"start < end, like 'orders-0:{1200:0{OFFSET_DIGITS}d}-{1500:0{OFFSET_DIGITS}d}'"
        )
    return OffsetRange(m["stream"], int(m["start"]), int(m["end"]))


def merge_offset_ranges(keys: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
    """Per stream, the selected ranges sorted, with overlapping and adjacent ones merged."""
    by_stream: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in sorted(parse_offset_range_key(k) for k in keys):
        runs = by_stream[r.stream]
        if runs and r.start <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(runs[-1][1], r.end))
        else:
            runs.append((r.start, r.end))
    return dict(by_stream)


def range_layers(keys: Iterable[str]) -> list[dict[str, tuple[int, int]]]:
    """The selected keys as few `{stream: (start, end)}` reads as possible: one per gap depth.

    Contiguous selections (what a sensor produces and a range backfill selects) give one layer,
    hence one Spark job; a selection with gaps in one stream gives one more layer per gap, so no
    offset outside the selected keys is read.
    """
    merged = merge_offset_ranges(keys)
    depth = max((len(v) for v in merged.values()), default=0)
    return [{s: runs[i] for s, runs in merged.items() if i < len(runs)} for i in range(depth)]


def range_run_key(ranges: dict[str, tuple[int, int]]) -> str:
    """A run key naming exactly `ranges` (their partition keys, joined by commas)."""
    return ",".join(offset_range_key(s, a, b) for s, (a, b) in sorted(ranges.items()) if b > a)
