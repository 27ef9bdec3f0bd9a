"""The base of `client.AsyncBrokerClient`: its connection and retries, and what it learns by reading
chunk headers through short subscriptions (tails, the oldest chunk, offsets and bounds in time,
a search of a small metadata stream).

StreamStats tells a stream's first and last chunk ids; where it does not tell the tail (brokers
before 4.3) or a position in time, a subscription with one credit at a time reads chunk headers
until it knows. Silence is ambiguous (a slow or paused broker looks like "nothing there"), so each
probe proves an empty answer before giving it, and retries within the recovery window otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rstream import exceptions as rx
from rstream import schema
from rstream.constants import OffsetType

from pyspark_rmqs.broker.placement import probe_locator
from pyspark_rmqs.broker.pool import get_pool
from pyspark_rmqs.broker.protocol import Chunk, RmqsClient
from pyspark_rmqs.broker.recovery import RECOVERY_WINDOW_S, retry_async
from pyspark_rmqs.broker.topology import Node
from pyspark_rmqs.core.errors import (
    BrokerTimeoutError,
    BrokerUnavailableError,
    StreamNotFoundError,
    access_refused,
)

log = logging.getLogger(__name__)
R = TypeVar("R")

PROBE_TIMEOUT_S = 1.5
# The subscription property that delivers every chunk, offset-tracking chunks included (the broker
# delivers only user chunks by default); brokers that do not know it deliver user chunks only.
EVERY_CHUNK = {"chunk_selector": "all"}


@dataclass(frozen=True)
class StreamStats:
    """StreamStats of one stream; `committed_offset` only on brokers that report it (4.3+)."""

    first_chunk_id: int
    committed_chunk_id: int
    committed_offset: int | None = None

    @property
    def is_empty(self) -> bool:
        return self.committed_chunk_id < 0

    @property
    def first_offset(self) -> int:
        """The first offset still in the stream (retention moves it forward); 0 for an empty stream."""
        return max(0, self.first_chunk_id)


@dataclass(frozen=True)
class TimeBound:
    """Where a time falls in a stream by the broker's clock (chunk timestamps), for windows of time.

    `passed`: the stream holds a chunk (of any kind, offset-tracking chunks included) timestamped at
    or after the time, so the broker's clock passed it; `offset` is that chunk's first offset, the
    same answer every later lookup gives (timestamps never go back). Otherwise `offset` is the tail
    measured before the broker showed that no chunk had reached the time, so every offset below it
    is older than the time; `last_timestamp` is then the newest chunk's timestamp (None: empty).
    """

    offset: int
    passed: bool
    last_timestamp: int | None = None


class ChunkProbes:
    """Connection, retries, StreamStats and chunk probes of one broker connection's settings.

    Each call waits out a broker restart (see `recovery.py`) once this process has reached the
    broker, or always when `patient` (executors: the driver reached the broker when it planned).
    """

    def __init__(self, conn: Any, request_timeout_s: float = 30.0, *, patient: bool = False) -> None:
        self.conn = conn
        self.timeout = request_timeout_s
        self.patient = patient
        self.message_size: dict[str, float] = {}  # average bytes per message of the last chunk seen

    async def _locator(self) -> RmqsClient:
        return await get_pool().locator(self.conn)

    async def _retry(
        self, what: str, attempt: Callable[[], Awaitable[R]], *, timeout_error: bool = False
    ) -> R:
        """`attempt()` until it succeeds, waiting out transient errors within the recovery window.

        With `timeout_error`, an attempt that timed out is retried even before this process reached
        the broker, and the final error is a `BrokerTimeoutError` (a probe that never answered).
        """

        def retry_if(err: BrokerUnavailableError) -> bool:  # a broker never reached fails at once
            timed_out = timeout_error and isinstance(err, BrokerTimeoutError)
            return self.patient or timed_out or get_pool().reached(self.conn)

        def exhausted(err: BrokerUnavailableError) -> BaseException:
            timed_out = timeout_error and isinstance(err, BrokerTimeoutError)
            return (BrokerTimeoutError if timed_out else BrokerUnavailableError)(
                f"{what}: the broker did not come back within {RECOVERY_WINDOW_S:.0f} s ({err})"
            )

        def on_retry(err: BrokerUnavailableError, delay: float, attempts: int) -> None:
            if attempts == 1:
                log.warning("%s; retrying for up to %.0f s", err, RECOVERY_WINDOW_S)

        return await retry_async(what, attempt, retry_if=retry_if, exhausted=exhausted, on_retry=on_retry)

    async def _call(self, what: str, coro_fn: Any) -> Any:
        async def once() -> Any:
            client = await self._locator()
            try:
                return await asyncio.wait_for(coro_fn(client), self.timeout)
            except TimeoutError as e:
                await get_pool().drop_locator(self.conn)
                raise BrokerTimeoutError(f"{what}: no answer from the broker") from e

        return await self._retry(what, once)

    async def stats(self, stream: str) -> StreamStats:
        try:
            raw = await self._call(f"stats({stream})", lambda c: c.stream_stats(stream))
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"stream '{stream}' does not exist") from e
        except rx.AccessRefused as e:
            raise access_refused(self.conn, stream, "read", "read the stats of") from e
        return StreamStats(
            first_chunk_id=raw.get("first_chunk_id", -1),
            committed_chunk_id=raw.get("committed_chunk_id", -1),
            committed_offset=raw.get("committed_offset"),
        )

    async def first_offset(self, stream: str) -> int:
        """The first offset still in the stream (retention moves it forward); 0 for an empty stream."""
        return (await self.stats(stream)).first_offset

    async def tail(self, stream: str) -> int:
        """The offset after the last user message: exact, even when offset-tracking entries follow it."""
        return await self._tail(stream, await self.stats(stream))

    async def bounds(self, stream: str) -> tuple[int, int]:
        """(first offset, tail) from one StreamStats call."""
        st = await self.stats(stream)
        return st.first_offset, await self._tail(stream, st)

    async def _tail(self, stream: str, st: StreamStats) -> int:
        if st.committed_offset is not None:
            return st.committed_offset + 1
        if st.is_empty:
            return max(0, st.first_chunk_id)
        last = await self._last_user_chunk(stream, st)
        # No user chunk at all (only tracking entries): nothing to read before the first chunk.
        return last.next_offset if last is not None else max(0, st.first_chunk_id)

    async def _last_user_chunk(self, stream: str, st: StreamStats) -> Chunk | None:
        """The last user chunk, proven: None only when the stream holds no user chunk at all.

        A subscription at `last` delivers the last user chunk, or nothing when there is none (the
        broker then waits for new data). Silence is therefore ambiguous: a slow or paused broker
        looks the same. An unfiltered scan from the first chunk tells them apart; a slow broker is
        retried within the recovery window and then fails with `BrokerTimeoutError`, never
        guessed (a guessed tail would make a batch read short and lag 0).
        """

        async def once() -> Chunk | None:
            last = await self._probe(stream, schema.OffsetSpec.from_params(OffsetType.LAST, None))
            if last is None:
                if not await self._has_user_chunk(stream, st):
                    return None
                raise BrokerTimeoutError(
                    f"tail of '{stream}': the broker did not deliver the last chunk within "
                    f"{PROBE_TIMEOUT_S} s"
                )
            if last.num_records:
                self.message_size[stream] = len(last.data) / last.num_records
            return last

        return await self._retry(f"tail of '{stream}'", once, timeout_error=True)

    async def _probe(self, stream: str, spec: Any, *, every_chunk: bool = False) -> Chunk | None:
        """The first chunk a subscription at `spec` delivers; None when none came within the probe timeout."""
        chunks = await self._scan(stream, spec, lambda chunk: True, every_chunk=every_chunk)
        return chunks[-1] if chunks else None

    async def _first_chunk_at(
        self, stream: str, timestamp_ms: int, *, every_chunk: bool = False
    ) -> Chunk | None:
        """The first chunk timestamped at or after `timestamp_ms`; None when none came within the
        probe timeout.

        A subscription at a timestamp does not always start there: RabbitMQ 4.0 attached one past
        every chunk to the first chunk of the stream's last segment, older than the time, when that
        segment began after the broker restarted (seen with small segments; found by the campaign:
        a Dagster window reported closed before its end, a time interval likewise). Its answer is
        checked, and older chunks are read past to the first one at or after the time.
        """
        spec = schema.OffsetSpec.from_params(OffsetType.TIMESTAMP, timestamp_ms)
        chunks = await self._scan(
            stream, spec, lambda c: c.timestamp >= timestamp_ms, every_chunk=every_chunk
        )
        return chunks[-1] if chunks and chunks[-1].timestamp >= timestamp_ms else None

    async def _has_user_chunk(self, stream: str, st: StreamStats) -> bool:
        """Whether `stream` holds any user chunk, by reading chunk headers from its first chunk.

        Called only when `last` delivered nothing, so the stream is normally all tracking entries
        (a short scan). Raises `BrokerTimeoutError` when the broker does not deliver in time.
        """
        seen: list[bool] = []

        def done(chunk: Chunk) -> bool:
            if chunk.chunk_type == 0:
                seen.append(True)
                return True
            return chunk.first_offset >= st.committed_chunk_id

        spec = schema.OffsetSpec.from_params(OffsetType.OFFSET, max(0, st.first_chunk_id))
        chunks = await self._scan(stream, spec, done, every_chunk=True)
        if not chunks or not done(chunks[-1]):
            raise BrokerTimeoutError(
                f"tail of '{stream}': the broker did not deliver its chunks within {PROBE_TIMEOUT_S} s"
            )
        return bool(seen)

    async def _scan(
        self, stream: str, spec: Any, done: Callable[[Chunk], bool], *, every_chunk: bool = False
    ) -> list[Chunk]:
        """Chunks from `spec`, one credit at a time, until `done(chunk)`; stops at the first silence.

        Returns what arrived (the last element satisfies `done` unless the broker went silent for
        `PROBE_TIMEOUT_S`). Chunk data is kept only for the last chunk. With `every_chunk`, the
        broker delivers offset-tracking chunks too (`EVERY_CHUNK`).
        """
        client, node = await probe_locator(self.conn, stream)  # a member's node: subscriptions need one
        sub = client.alloc_subscription_id()
        q: asyncio.Queue[Chunk] = asyncio.Queue()
        client.deliver_sinks[sub] = q.put_nowait
        out: list[Chunk] = []
        try:
            try:
                props = dict(EVERY_CHUNK) if every_chunk else None
                await client.subscribe(stream, sub, offset_spec=spec, initial_credit=1, properties=props)
            except rx.StreamDoesNotExist as e:
                raise StreamNotFoundError(f"stream '{stream}' does not exist") from e
            except rx.AccessRefused as e:
                raise access_refused(self.conn, stream, "read") from e
            try:
                while True:
                    try:
                        chunk = await asyncio.wait_for(q.get(), PROBE_TIMEOUT_S)
                    except TimeoutError:
                        return out
                    out.append(chunk)
                    if done(chunk):
                        return out
                    await client.credit(sub, 1)
            finally:
                await self._unsubscribe(client, sub, node)
        finally:
            client.deliver_sinks.pop(sub, None)

    async def find_message(
        self,
        stream: str,
        offset: int,
        match: Callable[[bytes], bool],
        *,
        max_chunks_past_retention: int | None = None,
    ) -> tuple[int, bytes] | None:
        """The first message at or after `offset` whose body `match`es: (its offset, its body).

        Reads whole chunks from `offset` (from the first offset kept when retention passed it) up to
        the stream's last chunk as StreamStats reports it when the search began, offset-tracking
        chunks too: the last chunk is usually one (a record's pointer is stored after it), and a
        scan that saw only user chunks could not tell the end from a silent broker. None when no
        message there matches (or the stream is empty); when retention passed `offset`, also when
        none of the first `max_chunks_past_retention` chunks kept does. Meant for small metadata
        streams (the run records), not for user data.
        """
        from pyspark_rmqs.core.chunks import chunk_records
        from pyspark_rmqs.core.codec import bodies

        st = await self.stats(stream)
        if st.is_empty:
            return None
        found: list[tuple[int, bytes]] = []
        limit = max_chunks_past_retention if offset < st.first_offset else None
        scanned, ended = 0, False

        def done(chunk: Chunk) -> bool:
            nonlocal scanned, ended
            scanned += 1
            if chunk.chunk_type == 0:
                for i, body in enumerate(bodies(chunk_records(chunk.data, chunk.num_entries))):
                    at = chunk.first_offset + i
                    if at >= offset and match(body):
                        found.append((at, body))
                        return True
            ended = chunk.first_offset >= st.committed_chunk_id or (limit is not None and scanned >= limit)
            return ended

        spec = schema.OffsetSpec.from_params(OffsetType.OFFSET, max(offset, st.first_offset))
        await self._scan(stream, spec, done, every_chunk=True)
        if found:
            return found[0]
        if not ended:
            raise BrokerTimeoutError(f"reading '{stream}': the broker did not deliver its chunks in time")
        return None

    async def _unsubscribe(self, client: RmqsClient, sub: int, node: Node | None = None) -> None:
        """End a probe subscription; a broker that does not answer loses the metadata connection instead."""
        try:
            await asyncio.wait_for(client.unsubscribe(sub), PROBE_TIMEOUT_S * 2)
        except Exception:  # gone with the stream, or the broker is paused: do not leave it half open
            log.debug("unsubscribe after a probe failed; dropping the metadata connection", exc_info=True)
            await get_pool().drop_locator(self.conn, node)

    async def offset_for_timestamp(self, stream: str, timestamp_ms: int) -> int:
        """The first offset of the first chunk at or after `timestamp_ms`; the tail when there is none.

        A subscription at a timestamp past every chunk delivers nothing, as a paused broker does;
        the answer "the tail" is given only when the last user chunk is older than `timestamp_ms`.
        """
        what = f"offset of '{stream}' at {timestamp_ms}"
        return await self._retry(
            what, lambda: self._offset_for_timestamp_once(stream, timestamp_ms), timeout_error=True
        )

    async def _offset_for_timestamp_once(self, stream: str, timestamp_ms: int) -> int:
        st = await self.stats(stream)
        tail = await self._tail(stream, st)
        if tail <= max(0, st.first_chunk_id):
            return tail
        chunk = await self._first_chunk_at(stream, timestamp_ms)
        if chunk is not None:
            return min(chunk.first_offset, tail)
        last = await self._last_user_chunk(stream, st)
        if last is None or last.timestamp < timestamp_ms:
            return tail
        raise BrokerTimeoutError(
            f"offset of '{stream}' at {timestamp_ms}: the broker delivered no chunk within "
            f"{PROBE_TIMEOUT_S} s"
        )

    async def oldest_chunk(self, stream: str) -> tuple[int, int] | None:
        """(first offset, timestamp) of the oldest chunk still in `stream`; None when it holds none.

        The timestamp is the broker's clock when it wrote the chunk (epoch millis). Retention removes
        whole segments from the start of a stream, so every message it removed is in an older chunk.
        A subscription at `first` that delivers nothing is a slow broker, never an answer: retried
        within the recovery window, then `BrokerTimeoutError`.
        """

        async def once() -> tuple[int, int] | None:
            if (await self.stats(stream)).is_empty:
                return None
            chunk = await self._probe(stream, schema.OffsetSpec.from_params(OffsetType.FIRST, None))
            if chunk is None:
                raise BrokerTimeoutError(
                    f"oldest chunk of '{stream}': the broker delivered no chunk within {PROBE_TIMEOUT_S} s"
                )
            return chunk.first_offset, chunk.timestamp

        return await self._retry(f"oldest chunk of '{stream}'", once, timeout_error=True)

    async def time_bounds(self, stream: str, timestamps_ms: Sequence[int]) -> list[TimeBound]:
        """Whether the broker's clock passed each time on `stream`, and the offset there (`TimeBound`).

        Windows of time meet at these offsets: a window is closed only once its end has `passed`
        (a chunk timestamped at or after it exists), and then it ends where the next one starts.
        `timestamps_ms` ascend; once one has not passed, the later ones share its answer. The tail
        is measured once, first: every "not passed" proof comes after it.
        """
        times = list(timestamps_ms)
        if times != sorted(times):
            raise ValueError(f"time bounds need ascending timestamps; got {times}")
        tail = await self.tail(stream)
        out: list[TimeBound] = []
        for t in times:
            if out and not out[-1].passed:
                out.append(out[-1])
                continue
            once = functools.partial(self._time_bound_once, stream, t, tail)
            out.append(await self._retry(f"time bound of '{stream}' at {t}", once, timeout_error=True))
        return out

    async def _time_bound_once(self, stream: str, timestamp_ms: int, tail: int) -> TimeBound:
        chunk = await self._first_chunk_at(stream, timestamp_ms, every_chunk=True)
        if chunk is not None:
            return TimeBound(chunk.first_offset, True, chunk.timestamp)
        # Silence: nothing reached the time yet, or a slow broker. The newest chunk tells them apart.
        st = await self.stats(stream)
        if st.is_empty:
            return TimeBound(tail, False, None)
        spec = schema.OffsetSpec.from_params(OffsetType.OFFSET, st.committed_chunk_id)
        last = await self._probe(stream, spec, every_chunk=True)
        if last is not None and last.timestamp < timestamp_ms:
            return TimeBound(tail, False, last.timestamp)
        raise BrokerTimeoutError(  # a chunk reached the time since the probe, or the broker is slow
            f"time bound of '{stream}' at {timestamp_ms}: the broker delivered no chunk within "
            f"{PROBE_TIMEOUT_S} s"
        )
