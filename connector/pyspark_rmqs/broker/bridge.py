"""The loop-side half of one subscription: chunks into a bounded queue, credits out.

`RangeReader` (reader.py) owns the range's semantics: where to subscribe, gaps and data loss,
resubscribing, filtering, when the range is done. This module owns the flow control between the
broker and that reader: which chunks are queued, how many credits are granted and when. They change
for different reasons (a broker's credit rule or a chunk-size policy vs. read guarantees), and the
credit policy is tested on its own against a simulation of the broker's rule
(tests/unit/test_reader_credits.py).

Everything here runs on the process's asyncio loop thread except `get` and `consumed`, which the
reading thread calls as chunks leave the queue; the counters are shared under one lock.

Chunks cross to the reading thread in hand-overs, not one by one: what one turn of the loop
delivers (every frame already in the socket buffer) is queued as one list at the end of that turn.
A put per chunk woke the waiting reader once per chunk, and each wake-up then contended for the GIL
with the loop thread still parsing the next frames; on 50-message chunks that was 20,000 wake-ups
per million messages.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from dataclasses import dataclass

from pyspark_rmqs.broker.protocol import Chunk, RmqsClient
from pyspark_rmqs.core.errors import BrokerUnavailableError

# Adaptive credits (initialCredits=0): the first request, and the ceilings on chunks in flight and
# on the bytes queued plus in flight (chunks are at most a few MiB; the queue bounds messages too).
# The first request must be 1: the broker resumes a subscription whose credit ran out only once its
# credit exceeds half the initial credit (its send limit), so with an initial 2 a later grant of 1
# would never be served; with 1 (limit 0) every grant is.
_AUTO_FIRST_CREDITS = 1
_AUTO_MAX_CREDITS = 32
_AUTO_MAX_BYTES = 32 << 20
# Adaptive credits are topped up once a quarter of the target has arrived, not chunk by chunk: one
# credit frame per chunk of 50 messages cost the loop thread a socket write per 50 messages (a third
# of its time in a profile) and the broker a command to parse.
_CREDIT_BATCHES = 4


@dataclass(frozen=True)
class Gap:
    """Offsets `[start, end)` the broker skipped over: tracking entries, filtered chunks, or lost.

    Consumers are not sent offset-tracking chunks and filtered-out chunks, so a gap alone proves
    nothing; the stream's first offset decides (`RangeReader._gap`).
    """

    start: int
    end: int


class Bridge:
    """Loop-side half of one subscription: receives chunks, grants credits.

    Fixed credits (`initial_credits` >= 1): that many chunks are requested at first, then one per
    delivered chunk while the queue holds fewer than `capacity` messages.

    Adaptive credits (`initial_credits` 0, the default): the chunks kept in flight follow the
    chunk sizes observed so far, so that the queued messages plus the in-flight chunks (at their
    average size) stay within `capacity` messages and `_AUTO_MAX_BYTES` bytes, never above
    `_AUTO_MAX_CREDITS` chunks nor above the chunks the rest of the range needs, and at least one
    chunk when the queue is empty. Small chunks (a producer's batch of 100) then keep several in
    flight; chunks as large as the queue keep one, as fixed credits of 1 do.
    """

    def __init__(
        self,
        client: RmqsClient,
        sub: int,
        start: int,
        end: int,
        capacity: int,
        *,
        filtered: bool,
        credits: int = 1,
    ) -> None:
        self.client = client
        self.sub = sub
        self.end = end
        self.capacity = capacity
        self.filtered = filtered
        self.adaptive = credits <= 0
        # The offset the next delivered chunk should cover; one starting later opens a gap.
        self.expect = start
        # Lists of chunks and gaps in offset order (one per loop turn), or an error that ends the read.
        self.q: queue.SimpleQueue[list[Chunk | Gap] | BaseException] = queue.SimpleQueue()
        self._turn: list[Chunk | Gap] = []  # loop thread: this turn's items, handed over at its end
        self._taken: deque[Chunk | Gap] = deque()  # reading thread: handed over, not yet returned
        self.lock = threading.Lock()
        self.queued = 0
        self.queued_bytes = 0
        self.owed = 0
        self.done_receiving = False
        # adaptive credits: chunks requested and not yet delivered; what delivered chunks held
        self.in_flight = _AUTO_FIRST_CREDITS if self.adaptive else max(1, credits)
        self.seen_chunks = 0
        self.seen_records = 0
        self.seen_bytes = 0
        self.loop = asyncio.get_running_loop()

    @property
    def initial_credits(self) -> int:
        return self.in_flight

    def get(self, timeout: float) -> Chunk | Gap | BaseException:  # reading thread
        """The next chunk or gap in offset order, or the error that ends the read; waits at most
        `timeout` seconds, then raises `queue.Empty`."""
        if self._taken:
            return self._taken.popleft()
        got = self.q.get(timeout=timeout)
        if isinstance(got, BaseException):
            return got
        self._taken.extend(got)
        return self._taken.popleft()

    def fail(self, error: BaseException) -> None:  # loop thread
        """End the read with `error`, after the chunks already received (they are handed over first)."""
        self.loop.call_soon(self.q.put, error)

    def _put(self, item: Chunk | Gap) -> None:  # loop thread
        if not self._turn:
            self.loop.call_soon(self._hand_over)
        self._turn.append(item)

    def _hand_over(self) -> None:  # loop thread, once the frames already received are delivered
        items, self._turn = self._turn, []
        self.q.put(items)

    def on_chunk(self, chunk: Chunk) -> None:  # loop thread
        if chunk.first_offset > self.expect and self.expect < self.end:
            self._put(Gap(self.expect, chunk.first_offset))
        self.expect = max(self.expect, chunk.next_offset)
        if self.adaptive:
            self._on_chunk_adaptive(chunk)
            return
        if chunk.chunk_type != 0:  # not user data: nothing to queue, but keep the credit flowing
            if chunk.next_offset < self.end:
                self.loop.create_task(self._credit())
            return
        self._put(chunk)
        grant = False
        with self.lock:
            self.queued += chunk.num_records
            if chunk.next_offset >= self.end:
                self.done_receiving = True
            elif self.queued < self.capacity:
                grant = True
            else:
                self.owed += 1
        if grant:
            self.loop.create_task(self._credit())

    def _on_chunk_adaptive(self, chunk: Chunk) -> None:  # loop thread
        user = chunk.chunk_type == 0
        if user:
            self._put(chunk)
        with self.lock:
            self.in_flight = max(0, self.in_flight - 1)
            if user:
                size = len(chunk.data)
                self.queued += chunk.num_records
                self.queued_bytes += size
                self.seen_chunks += 1
                self.seen_records += chunk.num_records
                self.seen_bytes += size
            if chunk.next_offset >= self.end:
                self.done_receiving = True
            target = self._target()
            grant = max(0, target - self.in_flight)
            if self.in_flight and grant < max(1, target // _CREDIT_BATCHES):
                grant = 0  # enough still in flight: top up later, several chunks in one frame
            self.in_flight += grant
        if grant:
            self.loop.create_task(self._credit(grant))

    def _wanted(self) -> int:
        """Adaptive credits to grant now (under the lock): the target in flight minus those in flight."""
        return max(0, self._target() - self.in_flight)

    def _target(self) -> int:
        """Adaptive credits: the chunks to keep in flight now (under the lock)."""
        if self.done_receiving:
            return 0
        if self.seen_chunks:
            per_chunk = max(1.0, self.seen_records / self.seen_chunks)
            chunk_bytes = max(1.0, self.seen_bytes / self.seen_chunks)
        else:  # nothing seen yet (only tracking chunks): keep the first credits flowing
            per_chunk, chunk_bytes = float(self.capacity), 1.0
        room = min(
            (self.capacity - self.queued) / per_chunk,
            (_AUTO_MAX_BYTES - self.queued_bytes) / chunk_bytes,
        )
        left = max(1, -(-(self.end - self.expect) // int(per_chunk)))  # chunks the range still needs
        target = min(_AUTO_MAX_CREDITS, left, int(room))
        if target < 1 and self.queued == 0:
            target = 1  # a chunk bigger than the queue: one at a time, as with one fixed credit
        return target

    def consumed(self, n: int, nbytes: int = 0) -> None:  # reader thread
        grant = 0
        with self.lock:
            self.queued -= n
            self.queued_bytes -= nbytes
            if self.adaptive:
                # Top up only when the loop side could not (the queue was full) and enough is owed,
                # so most chunks are credited on the loop thread, without a wake-up from here.
                want = self._wanted()
                if want and (self.in_flight == 0 or want >= max(1, (self.in_flight + want) // 2)):
                    grant = want
                    self.in_flight += grant
            elif self.owed and not self.done_receiving and self.queued < self.capacity:
                self.owed -= 1
                grant = 1
        if grant:
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._credit(grant)))

    async def _credit(self, n: int = 1) -> None:
        try:
            await self.client.credit(self.sub, n)
        except Exception as e:  # surfaces in the reader as a lost connection
            self.q.put(BrokerUnavailableError(f"could not grant credit: {e}"))
