"""Watermarks: the orchestration core (Airflow, Dagster, the CLI).

A consumer name's broker-stored offset is the pipeline's watermark: the last offset whose data
reached the sink. A run reads `[watermark + 1, tail)` with the tail fixed when it starts, writes
the sink, and only then stores the new watermarks. Everything here is metadata: no message is
read, no JVM is started. `awatermarks` / `astore_watermarks` run on the caller's event loop
(Airflow triggers); the plain functions on the broker loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pyspark_rmqs.broker.client import AsyncBrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.errors import ConfigurationError


@dataclass(frozen=True)
class PartitionWatermark:
    """One partition stream: first available offset, tail, stored watermark and lag."""

    stream: str
    first: int
    tail: int
    stored: int | None

    @property
    def next_offset(self) -> int:
        """Where the next run starts: after the watermark, or the first offset without one."""
        return self.first if self.stored is None else max(self.stored + 1, self.first)

    @property
    def lag(self) -> int:
        """Messages published but not yet past the watermark: max(0, tail - (stored + 1))."""
        return max(0, self.tail - self.next_offset)

    @property
    def lost(self) -> int:
        """Messages after the watermark that retention removed before they were read."""
        return 0 if self.stored is None else max(0, self.first - (self.stored + 1))


@dataclass(frozen=True)
class Watermarks:
    target: str
    consumer: str
    superstream: bool
    partitions: tuple[PartitionWatermark, ...]

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def pending(self) -> dict[str, tuple[int, int]]:
        """The ranges a run reads now: `{stream: (start, end)}` with end = the tail, non-empty only."""
        return {p.stream: (p.next_offset, p.tail) for p in self.partitions if p.lag > 0}

    def tails(self) -> dict[str, int]:
        return {p.stream: p.tail for p in self.partitions}

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "consumer": self.consumer,
            "superstream": self.superstream,
            "total_lag": self.total_lag,
            "partitions": [
                {**asdict(p), "next_offset": p.next_offset, "lag": p.lag} for p in self.partitions
            ],
        }


def _target(stream: str | None, superstream: str | None) -> tuple[str, bool]:
    if (stream is None) == (superstream is None):
        raise ConfigurationError("give exactly one of 'stream' or 'superstream'")
    return (superstream, True) if superstream is not None else (str(stream), False)


async def awatermarks(
    conn: Any, consumer: str, *, stream: str | None = None, superstream: str | None = None
) -> Watermarks:
    """Tails, stored offsets and lag of `consumer` on a stream or every partition of a super stream."""
    name, is_super = _target(stream, superstream)
    client = AsyncBrokerClient(conn)
    if is_super:
        streams = await client.partitions(name)
    else:
        if not await client.stream_exists(name):
            from pyspark_rmqs.errors import StreamNotFoundError

            raise StreamNotFoundError(f"stream '{name}' does not exist")
        streams = [name]

    async def one(s: str) -> PartitionWatermark:
        (first, tail), stored = await asyncio.gather(client.bounds(s), client.stored_offset(consumer, s))
        return PartitionWatermark(s, first, tail, stored)

    sem = asyncio.Semaphore(16)

    async def bounded(s: str) -> PartitionWatermark:
        async with sem:
            return await one(s)

    parts = await asyncio.gather(*(bounded(s) for s in streams))
    return Watermarks(name, consumer, is_super, tuple(parts))


def watermarks(
    conn: Any, consumer: str, *, stream: str | None = None, superstream: str | None = None
) -> Watermarks:
    return run_sync(awatermarks(conn, consumer, stream=stream, superstream=superstream), 120, "watermarks")


async def astore_watermarks(conn: Any, consumer: str, last_offsets: Mapping[str, int]) -> None:
    """Store `consumer`'s watermark (last processed offset) per stream; call only after the sink succeeded."""
    await AsyncBrokerClient(conn).store_offsets(consumer, {s: o for s, o in last_offsets.items() if o >= 0})


def store_watermarks(conn: Any, consumer: str, last_offsets: Mapping[str, int]) -> None:
    run_sync(astore_watermarks(conn, consumer, last_offsets), 120, "store watermarks")


def watermarks_after(ranges: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """The watermarks to store once `ranges` ({stream: (start, end)}) reached the sink: end - 1."""
    return {s: end - 1 for s, (start, end) in ranges.items() if end > start}
