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
from pyspark_rmqs.broker.recovery import WATERMARKS_TIMEOUT_S
from pyspark_rmqs.errors import ConfigurationError, WatermarkConflictError
from pyspark_rmqs.target import Target

# A run's plan is kept in the broker as the stored offsets of two companion tracking names.
PLAN_START_SUFFIX = ".rmqs-plan-start"
PLAN_END_SUFFIX = ".rmqs-plan-end"
MAX_REFERENCE_LENGTH = 256  # the broker's limit on a consumer (tracking reference) name


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
        """The next offset to be written, per partition stream."""
        return {p.stream: p.tail for p in self.partitions}

    def stored_offsets(self) -> dict[str, int | None]:
        """The stored watermark per partition stream; None where the consumer name stored none."""
        return {p.stream: p.stored for p in self.partitions}

    def lags(self) -> dict[str, int]:
        """Messages published after the watermark, per partition stream (`total_lag` is their sum)."""
        return {p.stream: p.lag for p in self.partitions}

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


async def awatermarks(
    conn: Any, consumer: str, *, stream: str | None = None, superstream: str | None = None
) -> Watermarks:
    """Tails, stored offsets and lag of `consumer` on a stream or every partition of a super stream."""
    target = Target.of(stream, superstream)
    client = AsyncBrokerClient(conn)
    streams = await target.astreams(client)

    async def one(s: str) -> PartitionWatermark:
        (first, tail), stored = await asyncio.gather(client.bounds(s), client.stored_offset(consumer, s))
        return PartitionWatermark(s, first, tail, stored)

    sem = asyncio.Semaphore(16)

    async def bounded(s: str) -> PartitionWatermark:
        async with sem:
            return await one(s)

    parts = await asyncio.gather(*(bounded(s) for s in streams))
    return Watermarks(target.name, consumer, target.is_super, tuple(parts))


def watermarks(
    conn: Any, consumer: str, *, stream: str | None = None, superstream: str | None = None
) -> Watermarks:
    return run_sync(
        awatermarks(conn, consumer, stream=stream, superstream=superstream),
        WATERMARKS_TIMEOUT_S,
        "watermarks",
    )


async def astore_watermarks(conn: Any, consumer: str, last_offsets: Mapping[str, int]) -> None:
    """Store `consumer`'s watermark (last processed offset) per stream; call only after the sink succeeded."""
    await AsyncBrokerClient(conn).store_offsets(consumer, {s: o for s, o in last_offsets.items() if o >= 0})


def store_watermarks(conn: Any, consumer: str, last_offsets: Mapping[str, int]) -> None:
    run_sync(astore_watermarks(conn, consumer, last_offsets), WATERMARKS_TIMEOUT_S, "store watermarks")


def watermarks_after(ranges: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """The watermarks to store once `ranges` ({stream: (start, end)}) reached the sink: end - 1."""
    return {s: end - 1 for s, (start, end) in ranges.items() if end > start}


# ------------------------------------------------------------------------------- persisted plans


def plan_names(consumer: str) -> tuple[str, str]:
    """The tracking names holding `consumer`'s pending plan: its planned starts and ends."""
    longest = MAX_REFERENCE_LENGTH - max(len(PLAN_START_SUFFIX), len(PLAN_END_SUFFIX))
    if len(consumer.encode()) > longest:
        raise ConfigurationError(
            f"consumer name '{consumer[:40]}...' is {len(consumer.encode())} bytes; at most {longest} bytes "
            f"(the broker allows {MAX_REFERENCE_LENGTH}, and rmqs keeps a run's plan under the name plus "
            f"'{PLAN_START_SUFFIX}' / '{PLAN_END_SUFFIX}')"
        )
    return consumer + PLAN_START_SUFFIX, consumer + PLAN_END_SUFFIX


async def apending_plan(conn: Any, w: Watermarks) -> dict[str, tuple[int, int]]:
    """The ranges of a run that planned but never stored its watermark: `{stream: (start, end)}`.

    A plan is pending on a partition stream when its recorded start is where the watermark says
    the next run starts (stored + 1, or any start when nothing is stored yet) and its end is past
    that start. Once the run stored `end - 1`, the recorded start no longer matches: done. A plan
    whose start matches no longer (the watermark was moved by hand or by another run) is stale.
    """
    start_name, end_name = plan_names(w.consumer)
    client = AsyncBrokerClient(conn)
    names = [p.stream for p in w.partitions]
    starts, ends = await asyncio.gather(
        client.stored_offsets(start_name, names), client.stored_offsets(end_name, names)
    )
    pending: dict[str, tuple[int, int]] = {}
    for p in w.partitions:
        s, e = starts[p.stream], ends[p.stream]
        if s is None or e is None:
            continue
        if (p.stored is None or s == p.stored + 1) and e > s:
            pending[p.stream] = (s, e)
    return pending


def pending_plan(conn: Any, w: Watermarks) -> dict[str, tuple[int, int]]:
    return run_sync(apending_plan(conn, w), WATERMARKS_TIMEOUT_S, "pending plan")


def record_plan(conn: Any, consumer: str, ranges: Mapping[str, tuple[int, int]]) -> None:
    """Keep a run's planned `[start, end)` per stream in the broker before anything is read.

    Starts are stored first, then ends: a run that dies between the two leaves a record whose start
    matches no watermark or whose end is not past it, which is never taken for a pending plan.
    """
    start_name, end_name = plan_names(consumer)
    todo = {s: r for s, r in ranges.items() if r[1] > r[0]}
    if not todo:
        return

    async def record() -> None:
        client = AsyncBrokerClient(conn)
        await client.store_offsets(start_name, {s: a for s, (a, _) in todo.items()})
        await client.store_offsets(end_name, {s: b for s, (_, b) in todo.items()})

    run_sync(record(), WATERMARKS_TIMEOUT_S, "record plan")


def store_watermarks_checked(
    conn: Any, consumer: str, last_offsets: Mapping[str, int], seen: Mapping[str, int | None]
) -> None:
    """Store watermarks only if nobody moved them since `seen` (read when the run planned).

    Re-reads the watermarks first and fails with `WatermarkConflictError` (naming the consumer and
    both positions) when another run stored since; reads them back after storing and fails the
    same way when a concurrent store overwrote this one. Never stores a value below the current one.
    """

    async def check_and_store() -> None:
        client = AsyncBrokerClient(conn)
        wanted = {s: o for s, o in last_offsets.items() if o >= 0}  # -1: nothing read there, nothing to store
        streams = list(wanted)
        now = await client.stored_offsets(consumer, streams)
        moved = {s: (seen.get(s), now[s]) for s in streams if now[s] != seen.get(s)}
        if moved:
            raise WatermarkConflictError(_conflict(consumer, moved, "since this run planned"))
        await client.store_offsets(consumer, wanted)
        after = await client.stored_offsets(consumer, streams)
        raced = {s: (wanted[s], after[s]) for s in streams if after[s] != wanted[s]}
        if raced:
            raise WatermarkConflictError(
                _conflict(consumer, raced, "while this run stored (expected, found)")
            )

    run_sync(check_and_store(), WATERMARKS_TIMEOUT_S, "store watermarks")


def _conflict(consumer: str, moved: Mapping[str, tuple[int | None, int | None]], when: str) -> str:
    where = ", ".join(f"'{s}': {a} -> {b}" for s, (a, b) in sorted(moved.items()))
    return (
        f"the watermark of consumer '{consumer}' was moved by another run {when}: {where}. Nothing was "
        "stored by this run; its rows may duplicate the other run's. Run one pipeline per consumer name "
        "at a time (the operators and assets serialise runs by default), or give each its own consumer name"
    )
