"""Adaptive reader credits against a simulated broker: bounded, never stalled, few credit frames.

The broker is simulated by its credit rule (one chunk per credit, in order, while chunks remain);
the reader side takes chunks off the bridge's queue as `RangeReader` does. Counting offsets and
credit frames here is exact and takes milliseconds; the real broker tests (tests/integration)
prove the same bridge against RabbitMQ.
"""

from __future__ import annotations

import asyncio
import queue

import pytest

from pyspark_rmqs.broker.bridge import _AUTO_MAX_CREDITS, Bridge
from pyspark_rmqs.broker.protocol import Chunk


class _Broker:
    """Credits granted to the subscription and the credit frames that carried them."""

    def __init__(self) -> None:
        self.credits = 0
        self.frames: list[int] = []

    async def credit(self, sub: int, n: int) -> None:
        self.frames.append(n)
        self.credits += n


async def _simulate(
    total: int, per_chunk: int, capacity: int, reader_takes: int
) -> tuple[list[int], int, int]:
    """Read [0, total) in chunks of `per_chunk`; the reader takes up to `reader_takes` chunks per turn.

    Returns the offsets read, the credit frames sent and the most messages ever queued or in flight.
    """
    broker = _Broker()
    bridge = Bridge(broker, 1, 0, total, capacity, filtered=False, credits=0)  # type: ignore[arg-type]
    broker.credits = bridge.initial_credits
    sent, peak = 0, 0
    offsets: list[int] = []
    idle_turns = 0
    while len(offsets) < total:
        delivered = 0
        while broker.credits and sent < total:
            n = min(per_chunk, total - sent)
            bridge.on_chunk(Chunk(1, 0, 1, n, 0, sent, b"x" * (n * 100)))
            broker.credits -= 1
            sent += n
            delivered += 1
        await asyncio.sleep(0)  # the credit tasks run
        peak = max(peak, bridge.queued + bridge.in_flight * per_chunk)
        taken = 0
        while taken < reader_takes:
            try:
                chunk = bridge.get(timeout=0)
            except queue.Empty:
                break
            assert isinstance(chunk, Chunk)
            offsets.extend(range(chunk.first_offset, chunk.next_offset))
            bridge.consumed(chunk.num_records, len(chunk.data))
            taken += 1
        await asyncio.sleep(0)
        idle_turns = idle_turns + 1 if not delivered and not taken else 0
        assert idle_turns < 3, f"stalled at offset {len(offsets)} of {total}: no credit, nothing queued"
    return offsets, len(broker.frames), peak


@pytest.mark.parametrize(
    ("total", "per_chunk", "capacity", "reader_takes"),
    [
        (100_000, 50, 10_000, 1),  # a producer's batch of 100: small chunks, a slow reader
        (100_000, 50, 10_000, 64),  # the same, a fast reader
        (100_000, 50, 500, 4),  # a small queue
        (50_000, 5_000, 10_000, 1),  # large chunks: one or two in flight
        (20_000, 5_000, 1_000, 2),  # chunks bigger than the queue: one at a time
        (1_003, 7, 100, 3),  # a range that does not end on a chunk boundary
    ],
)
def test_every_offset_once_within_the_queue_bound(
    total: int, per_chunk: int, capacity: int, reader_takes: int
) -> None:
    offsets, _frames, peak = asyncio.run(_simulate(total, per_chunk, capacity, reader_takes))
    assert offsets == list(range(total))
    assert peak <= max(capacity, per_chunk) + per_chunk  # the queue bound, plus the chunk being read


def test_small_chunks_are_credited_in_batches() -> None:
    """One credit frame per delivered chunk cost a socket write per 50 messages; top-ups come in batches."""
    chunks = 100_000 // 50
    _, frames, _ = asyncio.run(_simulate(100_000, 50, 10_000, 64))
    assert frames <= chunks // (_AUTO_MAX_CREDITS // 4) + 8, f"{frames} credit frames for {chunks} chunks"


def test_one_turns_chunks_cross_to_the_reader_in_one_hand_over_in_order() -> None:
    """Chunks delivered in one loop turn wake the reading thread once (a put per chunk woke it per
    chunk, 20,000 times per million 50-message messages), gaps keep their place, and an error ends
    the read only after what was handed over before it."""

    async def run() -> tuple[int, list[object]]:
        broker = _Broker()
        bridge = Bridge(broker, 1, 0, 1_000, 10_000, filtered=False, credits=0)  # type: ignore[arg-type]
        bridge.on_chunk(Chunk(1, 0, 1, 50, 0, 0, b"x" * 5_000))
        bridge.on_chunk(Chunk(1, 0, 1, 50, 0, 60, b"x" * 5_000))  # 50-59 skipped: a gap between
        bridge.on_chunk(Chunk(1, 0, 1, 50, 0, 110, b"x" * 5_000))
        assert bridge.q.empty()  # nothing crosses before the turn ends
        await asyncio.sleep(0)
        hand_overs = bridge.q.qsize()
        bridge.q.put(RuntimeError("connection lost"))
        items: list[object] = []
        while True:
            try:
                item = bridge.get(timeout=0)
            except queue.Empty:
                break
            items.append(item)
            if isinstance(item, BaseException):
                break
        return hand_overs, items

    hand_overs, items = asyncio.run(run())
    assert hand_overs == 1
    kinds = [(type(i).__name__, getattr(i, "first_offset", getattr(i, "start", None))) for i in items]
    assert kinds == [("Chunk", 0), ("Gap", 50), ("Chunk", 60), ("Chunk", 110), ("RuntimeError", None)]
