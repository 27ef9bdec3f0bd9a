"""The push-to-pull bridge: exactly the messages of `[start, end)` as Arrow RecordBatches.

The broker pushes chunks; Spark pulls rows. Between them sits a bounded queue. Credits (one per
chunk) are granted while the queue holds fewer than `queue_capacity` messages and never once the
delivered chunks reach `end`, so memory is bounded by the queue and the credits, not by the
range. The reader works per chunk: it never builds an object per message.

Waiting is bounded twice: `poll_timeout_ms` without any chunk, or `max_wait_ms` for the whole
read, fails the read (a range is never silently shortened). A lost connection (a broker restart)
resubscribes at the next offset to emit, waiting for the broker as `recovery.py` says; rows already
emitted are never emitted again. A range whose last offsets are not
user messages (offset-tracking entries) or whose chunks the broker skips (filtering) ends as soon
as the broker has nothing more to send and the stream's tail shows nothing is missing.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from rstream import exceptions as rx
from rstream import schema
from rstream.constants import OffsetType

from pyspark_rmqs import codec
from pyspark_rmqs.batches import BatchBuilder
from pyspark_rmqs.broker.client import AsyncBrokerClient
from pyspark_rmqs.broker.loop import get_loop, run_sync
from pyspark_rmqs.broker.pool import get_pool
from pyspark_rmqs.broker.protocol import Chunk, RmqsClient
from pyspark_rmqs.broker.recovery import RECOVERY_WINDOW_S, Backoff, as_transient
from pyspark_rmqs.errors import BrokerTimeoutError, BrokerUnavailableError, StreamNotFoundError

log = logging.getLogger(__name__)

_IDLE_CHECK_S = 0.25
# With filtering, the broker skips chunks without a matching filter value and sends nothing: a
# read whose range is fully written ends after this long without a chunk.
_FILTER_IDLE_END_S = 2.0
_MAX_RECONNECTS = 5  # connection losses in a row without a single new message


@dataclass
class ReadSettings:
    """What a reader needs beyond the range; built from `SourceOptions` on the driver."""

    metadata_fields: Sequence[str] = ()
    initial_credits: int = 1
    queue_capacity: int = 10_000
    poll_timeout_ms: int = 30_000
    max_wait_ms: int = 300_000
    filter_values: Sequence[str] = ()
    filter_match_unfiltered: bool = False
    post_filter: Any = None  # callable(Decoded) -> bool, or None
    strict: bool = False
    batch_rows: int = 8192
    consumer_name: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class _Bridge:
    """Loop-side half of one subscription: receives chunks, grants credits."""

    def __init__(self, client: RmqsClient, sub: int, end: int, capacity: int) -> None:
        self.client = client
        self.sub = sub
        self.end = end
        self.capacity = capacity
        self.q: queue.SimpleQueue[Chunk | BaseException] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.queued = 0
        self.owed = 0
        self.done_receiving = False
        self.loop = asyncio.get_running_loop()

    def on_chunk(self, chunk: Chunk) -> None:  # loop thread
        if chunk.chunk_type != 0:  # not user data: nothing to queue, but keep the credit flowing
            if chunk.next_offset < self.end:
                self.loop.create_task(self._credit())
            return
        self.q.put(chunk)
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

    def consumed(self, n: int) -> None:  # reader thread
        grant = False
        with self.lock:
            self.queued -= n
            if self.owed and not self.done_receiving and self.queued < self.capacity:
                self.owed -= 1
                grant = True
        if grant:
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._credit()))

    async def _credit(self) -> None:
        try:
            await self.client.credit(self.sub, 1)
        except Exception as e:  # surfaces in the reader as a lost connection
            self.q.put(BrokerUnavailableError(f"could not grant credit: {e}"))


class RangeReader:
    """Iterate RecordBatches holding exactly the messages of `[start, end)` of one stream."""

    def __init__(self, conn: Any, stream: str, start: int, end: int, settings: ReadSettings) -> None:
        self.conn = conn
        self.stream = stream
        self.start = start
        self.end = end
        self.s = settings
        self.next_offset = start  # the next offset to emit; survives reconnections
        self.rows = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self.start >= self.end:
            return
        builder = BatchBuilder(self.stream, self.s.metadata_fields, self.s.strict)
        deadline = time.monotonic() + self.s.max_wait_ms / 1000
        reconnects = 0
        while self.next_offset < self.end:
            client, bridge = self._subscribe_waiting(deadline)
            resumed_at = self.next_offset
            try:
                yield from self._drain(bridge, builder, deadline)
            except BrokerTimeoutError:
                # pollTimeoutMs / maxWaitMs: the connection is fine, the data is not there; no retry.
                run_sync(self._close(client, bridge, reuse=False), 30)
                raise
            except BrokerUnavailableError:
                reconnects = 1 if self.next_offset > resumed_at else reconnects + 1
                if reconnects > _MAX_RECONNECTS:
                    raise
                log.warning(
                    "connection lost reading '%s' at offset %d; resubscribing (%d/%d)",
                    self.stream,
                    self.next_offset,
                    reconnects,
                    _MAX_RECONNECTS,
                )
                run_sync(self._close(client, bridge, reuse=False), 30)
                continue
            except BaseException:
                run_sync(self._close(client, bridge, reuse=False), 30)
                raise
            run_sync(self._close(client, bridge, reuse=True), 30)
        batch = builder.flush()
        if batch is not None:
            yield batch

    def _drain(self, bridge: _Bridge, builder: BatchBuilder, deadline: float) -> Iterator[pa.RecordBatch]:
        poll_s = self.s.poll_timeout_ms / 1000
        last_chunk_at = time.monotonic()
        idle_checked_at = 0.0
        while self.next_offset < self.end:
            now = time.monotonic()
            if now > deadline:
                raise BrokerTimeoutError(
                    f"reading '{self.stream}' [{self.start}, {self.end}) took longer than maxWaitMs="
                    f"{self.s.max_wait_ms}; stopped at offset {self.next_offset}"
                )
            try:
                item = bridge.q.get(timeout=_IDLE_CHECK_S)
            except queue.Empty:
                if not bridge.client.is_connection_alive():
                    raise BrokerUnavailableError(
                        f"connection to the broker lost while reading '{self.stream}'"
                    ) from None
                idle = time.monotonic() - last_chunk_at
                if idle >= _IDLE_CHECK_S and time.monotonic() - idle_checked_at > 1.0:
                    idle_checked_at = time.monotonic()
                    if self._nothing_left(idle):
                        self.next_offset = self.end
                        return
                if idle > poll_s:
                    raise BrokerTimeoutError(
                        f"no message from '{self.stream}' for pollTimeoutMs={self.s.poll_timeout_ms} ms "
                        f"while reading [{self.start}, {self.end}); stopped at offset {self.next_offset}"
                    ) from None
                continue
            if isinstance(item, BaseException):
                raise item
            last_chunk_at = time.monotonic()
            self._take(item, builder)
            bridge.consumed(item.num_records)
            if builder.rows >= self.s.batch_rows:
                batch = builder.flush()
                if batch is not None:
                    self.rows += batch.num_rows
                    yield batch

    def _take(self, chunk: Chunk, builder: BatchBuilder) -> None:
        first = chunk.first_offset
        lo = max(self.next_offset, first)
        hi = min(self.end, chunk.next_offset)
        if hi <= lo:
            if chunk.next_offset > self.next_offset:
                self.next_offset = min(self.end, chunk.next_offset)
            return
        if self.s.filter_values and self.s.post_filter is not None:
            part = codec.chunk_records(chunk.data, chunk.num_entries)[lo - first : hi - first]
            self._add_filtered(part, lo, chunk.timestamp, builder)
        else:
            builder.add_chunk(chunk.data, chunk.num_entries, lo - first, hi - lo, lo, chunk.timestamp)
        self.next_offset = hi

    def _add_filtered(
        self, records: Sequence[memoryview], first: int, ts: int, builder: BatchBuilder
    ) -> None:
        run: list[memoryview] = []
        run_start = first
        for i, m in enumerate(records):
            try:
                keep = bool(self.s.post_filter(codec.decode(m)))
            except ValueError:
                keep = self.s.filter_match_unfiltered
            if keep:
                if not run:
                    run_start = first + i
                run.append(m)
            elif run:
                builder.add(run, run_start, ts)
                run = []
        if run:
            builder.add(run, run_start, ts)

    def _subscribe_waiting(self, deadline: float) -> tuple[RmqsClient, _Bridge]:
        """Subscribe at `next_offset`, waiting out a restarting broker (never past maxWaitMs)."""
        backoff: Backoff | None = None
        while True:
            try:
                return run_sync(self._subscribe(self.next_offset), 60, f"subscribe to '{self.stream}'")
            except Exception as e:
                err = as_transient(e, f"subscribe to '{self.stream}'")
                if err is None:
                    raise
                backoff = backoff or Backoff(deadline=deadline)
                delay = backoff.next_delay()
                if delay is None:
                    raise BrokerUnavailableError(
                        f"could not resume reading '{self.stream}' at offset {self.next_offset}: the broker "
                        f"did not come back within {RECOVERY_WINDOW_S:.0f} s (or maxWaitMs) ({err})"
                    ) from e
                log.debug("subscribe to '%s' failed (%s); retrying in %.2f s", self.stream, err, delay)
                time.sleep(delay)

    def _nothing_left(self, idle_s: float) -> bool:
        """True when no user message remains in [next_offset, end): the broker has nothing to send."""
        aio = AsyncBrokerClient(self.conn, patient=True)
        tail = run_sync(aio.tail(self.stream), 30, f"tail of '{self.stream}'")
        if tail <= self.next_offset:
            stats = run_sync(aio.stats(self.stream), 30)
            # Every offset below `end` is written (tracking entries included): nothing more can come.
            return stats.committed_chunk_id + 1 >= self.end or tail >= self.end
        # Filtering: the broker skips chunks without a matching filter value.
        return bool(self.s.filter_values) and tail >= self.end and idle_s >= _FILTER_IDLE_END_S

    async def _subscribe(self, offset: int) -> tuple[RmqsClient, _Bridge]:
        client = await get_pool().acquire(self.conn, "rmqs-reader")
        sub = client.alloc_subscription_id()
        bridge = _Bridge(client, sub, self.end, self.s.queue_capacity)
        client.deliver_sinks[sub] = bridge.on_chunk
        props: dict[str, str] = {}
        if self.s.filter_values:
            for i, v in enumerate(self.s.filter_values):
                props[f"filter.{i}"] = v
            props["match-unfiltered"] = "true" if self.s.filter_match_unfiltered else "false"
        try:
            await client.subscribe(
                self.stream,
                sub,
                offset_spec=schema.OffsetSpec.from_params(OffsetType.OFFSET, offset),
                initial_credit=max(1, self.s.initial_credits),
                properties=props or None,
            )
        except rx.StreamDoesNotExist as e:
            client.deliver_sinks.pop(sub, None)
            get_pool().release(self.conn, client)
            raise StreamNotFoundError(f"stream '{self.stream}' does not exist") from e
        except BaseException:
            client.deliver_sinks.pop(sub, None)
            await get_pool().discard(client)
            raise
        return client, bridge

    async def _close(self, client: RmqsClient, bridge: _Bridge, reuse: bool) -> None:
        client.deliver_sinks.pop(bridge.sub, None)
        if reuse and client.is_connection_alive():
            try:
                await asyncio.wait_for(client.unsubscribe(bridge.sub), 10)
                get_pool().release(self.conn, client)
                return
            except Exception:
                log.debug("unsubscribe failed; closing the connection", exc_info=True)
        await get_pool().discard(client)


def read_range(
    conn: Any, stream: str, start: int, end: int, settings: ReadSettings | None = None
) -> pa.Table:
    """Convenience: the whole range as one Arrow table (tests, CLI, small reads)."""
    s = settings or ReadSettings()
    batches = list(RangeReader(conn, stream, start, end, s))
    if not batches:
        return BatchBuilder(stream, s.metadata_fields).schema.empty_table()
    return pa.Table.from_batches(batches)


__all__ = ["RangeReader", "ReadSettings", "get_loop", "read_range"]
