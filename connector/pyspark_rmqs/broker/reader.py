"""The push-to-pull bridge: exactly the messages of `[start, end)` as Arrow RecordBatches.

The broker pushes chunks; Spark pulls rows. Between them sits a bounded queue, fed by the
subscription's `Bridge` (bridge.py), which grants credits only while the queue and the chunks in
flight stay within `queue_capacity` messages and never once the delivered chunks reach `end`, so
memory is bounded by the queue and the credits, not by the range. The reader works per chunk: it
never builds an object per message.

Waiting is bounded twice: `poll_timeout_ms` without any chunk, or `max_wait_ms` for the whole
read, fails the read (a range is never silently shortened). A lost connection (a broker restart)
resubscribes at the next offset to emit, waiting for the broker as `recovery.py` says; rows already
emitted are never emitted again. A range whose last offsets are not
user messages (offset-tracking entries) ends as soon as the stream's tail shows nothing is missing.

Time is measured where it is spent, per chunk and per batch (never per message): `decode_s` is the
time turning chunks into Arrow (walking them, the post filter, building each batch), `fetch_s` the
rest of the reader's own time (subscribing, waiting for and receiving chunks, credits, gap and tail
checks). Time the caller spends between two batches is in neither.

Data loss is checked where it happens: after every (re)subscription and between chunks, a gap in
the offsets the broker delivers (retention removed them, or the stream was deleted) is reported
through `planning.report_data_loss` with the stream, the missing offsets and `failOnDataLoss`; with
`failOnDataLoss=false` the lost ranges are logged and kept in `RangeReader.lost`.

Filtering: the broker skips chunks without a matching filter value and says nothing, so silence
cannot prove a filtered range complete. When a filtered subscription stays silent while the tail
shows user chunks left in the range, the reader reads the rest of the range unfiltered (the post
filter still applies): no matching message is ever dropped, at the price of the non-matching
messages of those last chunks when no post filter is set (as with Bloom false positives).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from rstream import exceptions as rx
from rstream import schema
from rstream.constants import OffsetType

from pyspark_rmqs.broker.bridge import Bridge, Gap
from pyspark_rmqs.broker.client import AsyncBrokerClient
from pyspark_rmqs.broker.loop import get_loop, run_sync
from pyspark_rmqs.broker.placement import connect_for
from pyspark_rmqs.broker.pool import get_pool
from pyspark_rmqs.broker.protocol import Chunk, RmqsClient
from pyspark_rmqs.broker.recovery import (
    CLOSE_TIMEOUT_S,
    COME_BACK_ADVICE,
    METADATA_CALL_TIMEOUT_S,
    RECOVERY_WINDOW_S,
    SUBSCRIBE_TIMEOUT_S,
    retry_sync,
)
from pyspark_rmqs.broker.topology import Node, node_of
from pyspark_rmqs.core import chunks, codec
from pyspark_rmqs.core.batches import BatchBuilder
from pyspark_rmqs.core.errors import (
    BrokerTimeoutError,
    BrokerUnavailableError,
    DataError,
    StreamNotFoundError,
    access_refused,
    lost_message,
    report_data_loss,
)
from pyspark_rmqs.options import SourceOptions

log = logging.getLogger(__name__)

_IDLE_CHECK_S = 0.25
# With filtering, the broker skips chunks without a matching filter value and sends nothing: after
# this long without a chunk while user chunks remain in the range, the rest is read unfiltered.
_FILTER_IDLE_END_S = 2.0
_MAX_RECONNECTS = 5  # connection losses in a row without a single new message


@dataclass
class ReadSettings:
    """What a reader needs beyond the range; built from `SourceOptions` on the driver."""

    metadata_fields: Sequence[str] = ()  # no metadata columns (the option's default is all of them)
    # Option defaults come from the option table (pyspark_rmqs.options): declared once, there.
    initial_credits: int = SourceOptions.default("initial_credits")
    queue_capacity: int = SourceOptions.default("queue_capacity")
    poll_timeout_ms: int = SourceOptions.default("poll_timeout_ms")
    max_wait_ms: int = SourceOptions.default("max_wait_ms")
    filter_values: Sequence[str] = ()
    filter_match_unfiltered: bool = SourceOptions.default("filter_match_unfiltered")
    post_filter: Any = None  # callable(Decoded) -> bool, or None
    strict: bool = SourceOptions.default("strict_decoding")
    batch_rows: int = 8192
    consumer_name: str | None = None
    fail_on_data_loss: bool = SourceOptions.default("fail_on_data_loss")
    extra: dict[str, str] = field(default_factory=dict)


class _Unfiltered(Exception):
    """Internal: a silent filtered subscription is replaced by an unfiltered one at `next_offset`."""


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
        self.chunks = 0  # user chunks taken (benchmarks report messages per chunk from it)
        self.lost: list[tuple[int, int]] = []  # ranges lost to retention or deletion (failOnDataLoss=false)
        self.subscriptions = 0  # (re)subscriptions made: 1 for a read no broker restart interrupted
        self.nodes: list[Node | None] = []  # the node of each subscription, as it advertises itself
        self.unfiltered_from: int | None = None  # where a filtered read went on unfiltered, if it did
        self.decode_s = 0.0  # turning chunks into Arrow batches (measured per chunk and per batch)
        self._busy_s = 0.0  # all the time spent inside the iterator (fetch_s is this minus decode_s)

    @property
    def fetch_s(self) -> float:
        """Seconds spent subscribing, waiting for and receiving chunks: the reader's time not decoding."""
        return max(0.0, self._busy_s - self.decode_s)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """The batches, timing the reader's own work (not the caller's between two batches)."""
        batches = self._batches()
        try:
            while True:
                t = time.perf_counter()
                try:
                    batch = next(batches, None)
                finally:
                    self._busy_s += time.perf_counter() - t
                if batch is None:
                    return
                yield batch
        finally:
            batches.close()  # a caller stopping early ends the inner read, and its subscription, with it

    def _batches(self) -> Generator[pa.RecordBatch, None, None]:
        if self.start >= self.end:
            return
        builder = BatchBuilder(self.stream, self.s.metadata_fields, self.s.strict)
        deadline = time.monotonic() + self.s.max_wait_ms / 1000
        reconnects = 0
        while self.next_offset < self.end:
            try:
                client, bridge = self._subscribe_waiting(deadline)
            except StreamNotFoundError:
                self._lose(self.next_offset, self.end, "the stream was deleted")
                break
            resumed_at = self.next_offset
            try:
                yield from self._drain(bridge, builder, deadline)
            except _Unfiltered:
                run_sync(self._close(client, bridge, reuse=False), CLOSE_TIMEOUT_S)
                continue
            except StreamNotFoundError:
                run_sync(self._close(client, bridge, reuse=False), CLOSE_TIMEOUT_S)
                self._lose(self.next_offset, self.end, "the stream was deleted")
                break
            except BrokerTimeoutError:
                # pollTimeoutMs / maxWaitMs: the connection is fine, the data is not there; no retry.
                run_sync(self._close(client, bridge, reuse=False), CLOSE_TIMEOUT_S)
                raise
            except BrokerUnavailableError as e:
                reconnects = 1 if self.next_offset > resumed_at else reconnects + 1
                if reconnects > _MAX_RECONNECTS:
                    raise
                log.warning(
                    "%s; resubscribing to '%s' at offset %d (%d/%d)",
                    e,
                    self.stream,
                    self.next_offset,
                    reconnects,
                    _MAX_RECONNECTS,
                )
                run_sync(self._close(client, bridge, reuse=False), CLOSE_TIMEOUT_S)
                continue
            except BaseException:
                run_sync(self._close(client, bridge, reuse=False), CLOSE_TIMEOUT_S)
                raise
            run_sync(self._close(client, bridge, reuse=True), CLOSE_TIMEOUT_S)
        batch = self._flush(builder)
        if batch is not None:
            yield batch

    def _flush(self, builder: BatchBuilder) -> pa.RecordBatch | None:
        t = time.perf_counter()
        try:
            batch = builder.flush()
        finally:
            self.decode_s += time.perf_counter() - t
        if batch is not None:
            self.rows += batch.num_rows
        return batch

    def _drain(self, bridge: Bridge, builder: BatchBuilder, deadline: float) -> Iterator[pa.RecordBatch]:
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
                item = bridge.get(timeout=_IDLE_CHECK_S)
            except queue.Empty:
                if not bridge.client.is_connection_alive():
                    raise BrokerUnavailableError(
                        f"connection to the broker lost while reading '{self.stream}'"
                    ) from None
                idle = time.monotonic() - last_chunk_at
                if idle >= _IDLE_CHECK_S and time.monotonic() - idle_checked_at > 1.0:
                    idle_checked_at = time.monotonic()
                    if self._nothing_left():
                        self.next_offset = self.end
                        return
                    if self._filter_silent(idle):
                        self.unfiltered_from = self.next_offset
                        log.info(
                            "filtered read of '%s' silent for %.1f s with chunks left in [%d, %d): "
                            "reading the rest unfiltered",
                            self.stream,
                            idle,
                            self.next_offset,
                            self.end,
                        )
                        raise _Unfiltered from None
                if idle > poll_s:
                    raise BrokerTimeoutError(
                        f"no message from '{self.stream}' for pollTimeoutMs={self.s.poll_timeout_ms} ms "
                        f"while reading [{self.start}, {self.end}); stopped at offset {self.next_offset}. "
                        "Retry: a slow broker may need a larger pollTimeoutMs; on a cluster, a stream "
                        "that lost the majority of its members delivers nothing until they are back"
                    ) from None
                continue
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Gap):
                self._gap(item)
                continue
            last_chunk_at = time.monotonic()
            self.chunks += 1
            # Out of the queue: credit the next chunks before walking this one, so they arrive meanwhile.
            bridge.consumed(item.num_records, len(item.data))
            t = time.perf_counter()
            try:
                self._take(item, builder)
            finally:
                self.decode_s += time.perf_counter() - t
            if builder.rows >= self.s.batch_rows:
                batch = self._flush(builder)
                if batch is not None:
                    yield batch

    def _gap(self, gap: Gap) -> None:
        """Offsets skipped by the broker are lost only if retention removed them: ask for the first offset.

        The first offset only grows, so a first offset at or below the gap's start now proves the
        gap held only offset-tracking entries or filtered-out chunks when the broker skipped it.
        """
        lo, hi = max(self.next_offset, gap.start), min(self.end, gap.end)
        if hi <= lo:
            return
        first = run_sync(
            AsyncBrokerClient(self.conn, patient=True).first_offset(self.stream), METADATA_CALL_TIMEOUT_S
        )
        if first > lo:
            self._lose(lo, min(hi, first), "retention removed them before the read reached them")

    def _lose(self, lo: int, hi: int, why: str) -> None:
        """Offsets `[lo, hi)` of the range are gone: fail (failOnDataLoss=true) or record and skip them."""
        report_data_loss(self.s.fail_on_data_loss, lost_message(self.stream, lo, hi, why))
        self.lost.append((lo, hi))
        self.next_offset = max(self.next_offset, hi)

    def _take(self, chunk: Chunk, builder: BatchBuilder) -> None:
        first = chunk.first_offset
        lo = max(self.next_offset, first)
        hi = min(self.end, chunk.next_offset)
        if hi <= lo:
            if chunk.next_offset > self.next_offset:
                self.next_offset = min(self.end, chunk.next_offset)
            return
        if self.s.filter_values and self.s.post_filter is not None:
            try:
                part = chunks.chunk_records(chunk.data, chunk.num_entries)[lo - first : hi - first]
            except DataError as e:
                raise DataError(
                    f"cannot read the chunk at offset {first} of stream '{self.stream}': {e}"
                ) from e
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

    def _subscribe_waiting(self, deadline: float) -> tuple[RmqsClient, Bridge]:
        """Subscribe at `next_offset`, waiting out a restarting broker (never past maxWaitMs).

        A missing stream (`StreamNotFoundError`) is not transient: it is raised at once.
        """
        what = f"subscribe to '{self.stream}'"

        def exhausted(err: BrokerUnavailableError) -> BaseException:
            return BrokerUnavailableError(
                f"could not resume reading '{self.stream}' at offset {self.next_offset}: the broker "
                f"did not come back within {RECOVERY_WINDOW_S:.0f} s (or maxWaitMs) ({err}). "
                f"{COME_BACK_ADVICE}"
            )

        def on_retry(err: BrokerUnavailableError, delay: float, attempts: int) -> None:
            log.debug("subscribe to '%s' failed (%s); retrying in %.2f s", self.stream, err, delay)

        subscribed = retry_sync(
            what,
            lambda: run_sync(self._subscribe(self.next_offset), SUBSCRIBE_TIMEOUT_S, what),
            deadline=deadline,
            exhausted=exhausted,
            on_retry=on_retry,
        )
        self.subscriptions += 1
        return subscribed

    @property
    def _filtered(self) -> bool:
        return bool(self.s.filter_values) and self.unfiltered_from is None

    def _nothing_left(self) -> bool:
        """True when no user message remains in [next_offset, end): the broker has nothing to send."""
        aio = AsyncBrokerClient(self.conn, patient=True)
        tail = run_sync(aio.tail(self.stream), METADATA_CALL_TIMEOUT_S, f"tail of '{self.stream}'")
        if tail <= self.next_offset:
            stats = run_sync(aio.stats(self.stream), METADATA_CALL_TIMEOUT_S)
            # Every offset below `end` is written (tracking entries included): nothing more can come.
            return stats.committed_chunk_id + 1 >= self.end or tail >= self.end
        return False

    def _filter_silent(self, idle_s: float) -> bool:
        """Filtered, silent this long, user chunks left: go on unfiltered (never end short)."""
        return self._filtered and idle_s >= _FILTER_IDLE_END_S

    async def _subscribe(self, offset: int) -> tuple[RmqsClient, Bridge]:
        # A replica, else the leader (a node with no member of the stream cannot serve a subscription).
        client = await connect_for(self.conn, self.stream, "read", "rmqs-reader")
        self.nodes.append(node_of(client.server_properties))
        sub = client.alloc_subscription_id()
        bridge = Bridge(
            client,
            sub,
            offset,
            self.end,
            self.s.queue_capacity,
            filtered=self._filtered,
            credits=self.s.initial_credits,
        )
        client.deliver_sinks[sub] = bridge.on_chunk
        client.add_handler(schema.MetadataUpdate, self._on_metadata(bridge), name=f"rmqs-read-{sub}")
        props: dict[str, str] = {}
        if self._filtered:
            for i, v in enumerate(self.s.filter_values):
                props[f"filter.{i}"] = v
            props["match-unfiltered"] = "true" if self.s.filter_match_unfiltered else "false"
        try:
            await client.subscribe(
                self.stream,
                sub,
                offset_spec=schema.OffsetSpec.from_params(OffsetType.OFFSET, offset),
                initial_credit=bridge.initial_credits,
                properties=props or None,
            )
        except (rx.StreamDoesNotExist, rx.AccessRefused) as e:  # the connection is sound: kept
            client.deliver_sinks.pop(sub, None)
            client.remove_handler(schema.MetadataUpdate, f"rmqs-read-{sub}")
            get_pool().release(self.conn, client)
            if isinstance(e, rx.AccessRefused):
                raise access_refused(self.conn, self.stream, "read") from e
            raise StreamNotFoundError(f"stream '{self.stream}' does not exist") from e
        except BaseException:
            client.deliver_sinks.pop(sub, None)
            client.remove_handler(schema.MetadataUpdate, f"rmqs-read-{sub}")
            await get_pool().discard(client)
            raise
        return client, bridge

    def _on_metadata(self, bridge: Bridge) -> Callable[[schema.MetadataUpdate], None]:
        """The broker ends a subscription with a MetadataUpdate when the stream's member it reads
        from goes away: a replica restarts to follow a new leader when the leader's node dies, and
        its consumers receive nothing more. Resubscribe (asking the metadata again) at once."""

        def on_update(frame: schema.MetadataUpdate) -> None:
            if frame.metadata_info.stream == self.stream:
                bridge.fail(
                    BrokerUnavailableError(
                        f"the broker ended the subscription to '{self.stream}' (the stream's member "
                        f"moved or restarted: code {frame.metadata_info.code})"
                    )
                )

        return on_update

    async def _close(self, client: RmqsClient, bridge: Bridge, reuse: bool) -> None:
        client.deliver_sinks.pop(bridge.sub, None)
        client.remove_handler(schema.MetadataUpdate, f"rmqs-read-{bridge.sub}")
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
