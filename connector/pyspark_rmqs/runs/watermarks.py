"""Watermarks: the orchestration core (Airflow, Dagster, the CLI).

A consumer name's broker-stored offset is the pipeline's watermark: the last offset whose data
reached the sink. A run reads `[watermark + 1, tail)` with the tail fixed when it starts, writes
the sink, and only then stores the new watermarks. Everything here is metadata: no message is
read, no JVM is started. `awatermarks` / `astore_watermarks` run on the caller's event loop
(Airflow triggers); the plain functions on the broker loop thread.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pyspark_rmqs.broker.client import AsyncBrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.recovery import WATERMARKS_TIMEOUT_S
from pyspark_rmqs.core.errors import WatermarkConflictError
from pyspark_rmqs.core.target import Target


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
    conn: Any,
    consumer: str,
    *,
    stream: str | None = None,
    superstream: str | None = None,
    polling: bool = False,
) -> Watermarks:
    """Tails, stored offsets and lag of `consumer` on a stream or every partition of a super stream.

    All partitions' requests are in flight together on the loop's shared metadata connection, and
    shared with the other checks on the loop that ask for the same at the same time
    (`broker/lookups.py`); every answer was given after this call began. `polling` (checks that
    poll: triggers, sensors) shares the partitions, stats and tails with the other polling checks
    of the target on this loop that began before them, and reuses the tail (a subscription per
    stream on a broker before 4.3) and the stored offset read on this loop at the stream's current
    chunk ids.
    """
    since = time.monotonic()
    target = Target.of(stream, superstream)
    client = AsyncBrokerClient(conn)
    if polling:
        streams, rows = await client.polled_watermark_rows(target, consumer, since)
    else:
        streams = await target.astreams(client)
        rows = await client.watermark_rows(streams, consumer, since=since)
    parts = tuple(
        PartitionWatermark(s, first, tail, stored)
        for s, (first, tail, stored) in zip(streams, rows, strict=True)
    )
    return Watermarks(target.name, consumer, target.is_super, parts)


def watermarks(
    conn: Any,
    consumer: str,
    *,
    stream: str | None = None,
    superstream: str | None = None,
    polling: bool = False,
) -> Watermarks:
    return run_sync(
        awatermarks(conn, consumer, stream=stream, superstream=superstream, polling=polling),
        WATERMARKS_TIMEOUT_S,
        "watermarks",
    )


async def astore_watermarks(
    conn: Any, consumer: str, last_offsets: Mapping[str, int], *, allow_backwards: bool = False
) -> dict[str, int]:
    """Store `consumer`'s watermark (last processed offset) per stream; call only after the sink succeeded.

    Never backwards unless `allow_backwards` (what `rmqs watermark set` does after confirming): a
    value below the stored one is not stored, and is logged; returns those partitions with the
    watermark they keep.
    """
    client = AsyncBrokerClient(conn)
    if allow_backwards:
        await client.store_offsets(consumer, {s: o for s, o in last_offsets.items() if o >= 0})
        return {}
    return await client.store_offsets_forward(consumer, last_offsets)


def store_watermarks(
    conn: Any, consumer: str, last_offsets: Mapping[str, int], *, allow_backwards: bool = False
) -> dict[str, int]:
    return run_sync(
        astore_watermarks(conn, consumer, last_offsets, allow_backwards=allow_backwards),
        WATERMARKS_TIMEOUT_S,
        "store watermarks",
    )


def watermarks_after(ranges: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """The watermarks to store once `ranges` ({stream: (start, end)}) reached the sink: end - 1."""
    return {s: end - 1 for s, (start, end) in ranges.items() if end > start}


def store_watermarks_checked(
    conn: Any,
    consumer: str,
    last_offsets: Mapping[str, int],
    seen: Mapping[str, int | None],
    *,
    resumed: bool = False,
) -> dict[str, int]:
    """Store watermarks only where nobody else moved them since `seen` (read when the run planned).

    Never backwards: a value at or below `seen` is not stored; those partitions are returned
    (`{stream: watermark kept}`). Re-reads the watermarks first and fails with
    `WatermarkConflictError` (naming the consumer and both positions) when another run stored
    since; reads them back after storing and fails the same way when a concurrent store
    overwrote this one. A stored offset that vanished while below the stream's first offset was
    dropped by the broker (it forgets tracking entries under the first offset when a segment
    rolls), not moved by another run: it is stored over; and a value this run stores below the first
    offset (a resumed range retention overtook) may be gone as soon as it is stored: the run record
    places the consumer then. Only a `resumed` run may find its own
    values already stored (an earlier try of the same run stored some partitions, then died).
    """
    kept = {s: v for s, o in last_offsets.items() if (v := seen.get(s)) is not None and o <= v}

    async def check_and_store() -> None:
        client = AsyncBrokerClient(conn)
        wanted = {s: o for s, o in last_offsets.items() if o >= 0 and s not in kept}
        streams = list(wanted)
        if not streams:
            return
        now = await client.stored_offsets(consumer, streams)
        own = (lambda s: wanted[s]) if resumed else (lambda s: seen.get(s))
        moved = await _not_dropped(
            client, {s: (seen.get(s), now[s]) for s in streams if now[s] not in (seen.get(s), own(s))}
        )
        if moved:
            raise WatermarkConflictError(_conflict(consumer, moved, "since this run planned"))
        await client.store_offsets(consumer, wanted)
        after = await client.stored_offsets(consumer, streams)
        raced = await _not_dropped(
            client, {s: (wanted[s], after[s]) for s in streams if after[s] != wanted[s]}
        )
        if raced:
            raise WatermarkConflictError(
                _conflict(consumer, raced, "while this run stored (expected, found)")
            )

    run_sync(check_and_store(), WATERMARKS_TIMEOUT_S, "store watermarks")
    return kept


async def _not_dropped(
    client: AsyncBrokerClient, changes: Mapping[str, tuple[int | None, int | None]]
) -> dict[str, tuple[int | None, int | None]]:
    """`changes` (`{stream: (expected, found)}`) without those the broker made: an expected value
    below the stream's first offset found gone. The broker keeps no tracking entry under the first
    offset (it drops them when a segment rolls), so it is neither another run's move nor a race;
    the run record places the consumer then."""
    out = dict(changes)
    for s, (expected, found) in changes.items():
        if found is None and expected is not None and expected < await client.first_offset(s):
            del out[s]
    return out


def _conflict(consumer: str, moved: Mapping[str, tuple[int | None, int | None]], when: str) -> str:
    where = ", ".join(f"'{s}': {a} -> {b}" for s, (a, b) in sorted(moved.items()))
    return (
        f"the watermark of consumer '{consumer}' was moved by another run {when}: {where}. Nothing was "
        "stored by this run; its rows may duplicate the other run's. Run one pipeline per consumer name "
        "at a time (the operators and assets serialise runs by default), or give each its own consumer name"
    )
