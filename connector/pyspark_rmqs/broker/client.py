"""Broker metadata and offsets: an async client, and a sync facade over the process's loop thread.

`AsyncBrokerClient` works on whatever loop runs it (Airflow triggers use it directly);
`BrokerClient` runs the same coroutines on the loop thread of `loop.py`, so Spark's driver and
executors, Dagster and the CLI call plain functions. Connections come from `pool.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from rstream import exceptions as rx
from rstream import schema
from rstream.constants import OffsetType

from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.pool import get_pool
from pyspark_rmqs.broker.protocol import Chunk, RmqsClient
from pyspark_rmqs.broker.recovery import RECOVERY_WINDOW_S, Backoff, as_transient
from pyspark_rmqs.errors import BrokerTimeoutError, BrokerUnavailableError, StreamNotFoundError

log = logging.getLogger(__name__)
R = TypeVar("R")

PROBE_TIMEOUT_S = 1.5
STORE_PARALLELISM = 16


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


def parse_version(text: str) -> tuple[int, int, int]:
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in text.split(".")[:3]]
    return tuple([*parts, 0, 0, 0][:3])  # type: ignore[return-value]


class AsyncBrokerClient:
    """Metadata, tails and stored offsets of streams and super streams, on the running loop.

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

    async def _retry(self, what: str, attempt: Callable[[], Awaitable[R]]) -> R:
        backoff: Backoff | None = None
        while True:
            try:
                return await attempt()
            except Exception as e:
                err = as_transient(e, what)
                if err is None:
                    raise
                if not (self.patient or get_pool().reached(self.conn)):
                    if err is e:
                        raise
                    raise err from e
                backoff = backoff or Backoff()
                delay = backoff.next_delay()
                if delay is None:
                    raise BrokerUnavailableError(
                        f"{what}: the broker did not come back within {RECOVERY_WINDOW_S:.0f} s ({err})"
                    ) from e
                if backoff.attempts == 1:
                    log.warning("%s; retrying for up to %.0f s", err, RECOVERY_WINDOW_S)
                await asyncio.sleep(delay)

    async def _call(self, what: str, coro_fn: Any) -> Any:
        async def once() -> Any:
            client = await self._locator()
            try:
                return await asyncio.wait_for(coro_fn(client), self.timeout)
            except TimeoutError as e:
                await get_pool().drop_locator(self.conn)
                raise BrokerTimeoutError(f"{what}: no answer from the broker") from e

        return await self._retry(what, once)

    async def broker_version(self) -> str:
        client = await self._locator()
        return (client.server_properties or {}).get("version", "0.0.0")

    async def stream_exists(self, stream: str) -> bool:
        return bool(await self._call(f"stream_exists({stream})", lambda c: c.stream_exists(stream)))

    async def partitions(self, superstream: str) -> list[str]:
        """The partition streams of a super stream, in the broker's order (which hash routing uses)."""
        try:
            parts = await self._call(f"partitions({superstream})", lambda c: c.partitions(superstream))
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"super stream '{superstream}' does not exist") from e
        if not parts:
            raise StreamNotFoundError(f"super stream '{superstream}' does not exist or has no partitions")
        return list(parts)

    async def route(self, routing_key: str, superstream: str) -> list[str]:
        if routing_key is None:
            raise ValueError("route() needs a routing key, got None")
        return list(await self._call("route", lambda c: c.route(routing_key, superstream)))

    async def stats(self, stream: str) -> StreamStats:
        try:
            raw = await self._call(f"stats({stream})", lambda c: c.stream_stats(stream))
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"stream '{stream}' does not exist") from e
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
        last = await self._probe_last_chunk(stream)
        if last is not None and last.num_records:
            self.message_size[stream] = len(last.data) / last.num_records
        # No user chunk at all (only tracking entries): nothing to read before the first chunk.
        return last.next_offset if last is not None else max(0, st.first_chunk_id)

    async def _probe_last_chunk(self, stream: str) -> Chunk | None:
        """Subscribe at `last` (the last user chunk) with one credit and read its header."""
        return await self._retry(f"tail of '{stream}'", lambda: self._probe_last_chunk_once(stream))

    async def _probe_last_chunk_once(self, stream: str) -> Chunk | None:
        client = await self._locator()
        sub = client.alloc_subscription_id()
        got: asyncio.Future[Chunk] = asyncio.get_running_loop().create_future()

        def sink(chunk: Chunk) -> None:
            if not got.done():
                got.set_result(chunk)

        client.deliver_sinks[sub] = sink
        try:
            await client.subscribe(
                stream,
                sub,
                offset_spec=schema.OffsetSpec.from_params(OffsetType.LAST, None),
                initial_credit=1,
            )
            try:
                return await asyncio.wait_for(got, PROBE_TIMEOUT_S)
            except TimeoutError:
                return None
            finally:
                try:
                    await client.unsubscribe(sub)
                except Exception:  # the subscription may already be gone with the stream
                    log.debug("unsubscribe after tail probe failed", exc_info=True)
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"stream '{stream}' does not exist") from e
        finally:
            client.deliver_sinks.pop(sub, None)

    async def offset_for_timestamp(self, stream: str, timestamp_ms: int) -> int:
        """The first offset of the first chunk at or after `timestamp_ms`; the tail when there is none."""
        what = f"offset of '{stream}' at {timestamp_ms}"
        return await self._retry(what, lambda: self._offset_for_timestamp_once(stream, timestamp_ms))

    async def _offset_for_timestamp_once(self, stream: str, timestamp_ms: int) -> int:
        client = await self._locator()
        sub = client.alloc_subscription_id()
        got: asyncio.Future[Chunk] = asyncio.get_running_loop().create_future()
        client.deliver_sinks[sub] = lambda ch: None if got.done() else got.set_result(ch)
        try:
            try:
                await client.subscribe(
                    stream,
                    sub,
                    offset_spec=schema.OffsetSpec.from_params(OffsetType.TIMESTAMP, timestamp_ms),
                    initial_credit=1,
                )
            except rx.StreamDoesNotExist as e:
                raise StreamNotFoundError(f"stream '{stream}' does not exist") from e
            tail = await self.tail(stream)
            try:
                chunk = await asyncio.wait_for(got, PROBE_TIMEOUT_S) if tail > 0 else None
            except TimeoutError:
                chunk = None
            finally:
                try:
                    await client.unsubscribe(sub)
                except Exception:
                    log.debug("unsubscribe after timestamp probe failed", exc_info=True)
            return min(chunk.first_offset, tail) if chunk is not None else tail
        finally:
            client.deliver_sinks.pop(sub, None)

    async def stored_offset(self, consumer: str, stream: str) -> int | None:
        """The broker-stored offset of `consumer` on `stream`; None when it stored none."""
        try:
            return int(await self._call("query_offset", lambda c: c.query_offset(stream, consumer)))
        except rx.OffsetNotFound:
            return None
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"stream '{stream}' does not exist") from e

    async def stored_offsets(self, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
        names = list(streams)
        sem = asyncio.Semaphore(STORE_PARALLELISM)

        async def one(s: str) -> int | None:
            async with sem:
                return await self.stored_offset(consumer, s)

        values = await asyncio.gather(*(one(s) for s in names))
        return dict(zip(names, values, strict=True))

    async def store_offsets(self, consumer: str, offsets: Mapping[str, int]) -> None:
        """Store `consumer`'s offsets, concurrently with bounded parallelism; confirmed by a read-back.

        StoreOffset has no reply in the protocol, so each store is followed by a query: a store that
        returns has been applied.
        """
        sem = asyncio.Semaphore(STORE_PARALLELISM)

        async def one(stream: str, offset: int) -> None:
            async with sem:
                await self._call("store_offset", lambda c: c.store_offset(stream, consumer, offset))
                for _ in range(50):
                    if await self.stored_offset(consumer, stream) == offset:
                        return
                    await asyncio.sleep(0.02)
                raise BrokerTimeoutError(
                    f"stored offset of '{consumer}' on '{stream}' did not become {offset}"
                )

        await asyncio.gather(*(one(s, o) for s, o in offsets.items() if o >= 0))

    async def create_stream(self, stream: str, arguments: Mapping[str, Any] | None = None) -> None:
        try:
            await self._call("create_stream", lambda c: c.create_stream(stream, dict(arguments or {})))
        except rx.StreamAlreadyExists:
            pass

    async def delete_stream(self, stream: str) -> None:
        try:
            await self._call("delete_stream", lambda c: c.delete_stream(stream))
        except rx.StreamDoesNotExist:
            pass

    async def create_super_stream(
        self, name: str, partitions: int, arguments: Mapping[str, Any] | None = None
    ) -> None:
        """Partitions `name-0` .. `name-(N-1)` bound with keys "0" .. "N-1" ("already exists" is fine)."""
        parts = [f"{name}-{i}" for i in range(partitions)]
        keys = [str(i) for i in range(partitions)]
        try:
            await self._call(
                "create_super_stream",
                lambda c: c.create_super_stream(name, parts, keys, dict(arguments or {})),
            )
        except rx.StreamAlreadyExists:
            pass

    async def delete_super_stream(self, name: str) -> None:
        try:
            await self._call("delete_super_stream", lambda c: c.delete_super_stream(name))
        except rx.StreamDoesNotExist:
            pass


class BrokerClient:
    """The same calls, synchronous, on the process's broker loop thread."""

    def __init__(self, conn: Any, request_timeout_s: float = 30.0, *, patient: bool = False) -> None:
        self.aio = AsyncBrokerClient(conn, request_timeout_s, patient=patient)
        self._timeout = request_timeout_s * 4

    def _run(self, coro: Coroutine[Any, Any, R], what: str) -> R:
        return run_sync(coro, self._timeout, what)

    def broker_version(self) -> str:
        return self._run(self.aio.broker_version(), "broker_version")

    def stream_exists(self, stream: str) -> bool:
        return self._run(self.aio.stream_exists(stream), "stream_exists")

    def partitions(self, superstream: str) -> list[str]:
        return self._run(self.aio.partitions(superstream), "partitions")

    def route(self, routing_key: str, superstream: str) -> list[str]:
        return self._run(self.aio.route(routing_key, superstream), "route")

    def stats(self, stream: str) -> StreamStats:
        return self._run(self.aio.stats(stream), "stats")

    def first_offset(self, stream: str) -> int:
        return self._run(self.aio.first_offset(stream), "first_offset")

    def tail(self, stream: str) -> int:
        return self._run(self.aio.tail(stream), "tail")

    def message_sizes(self) -> dict[str, float]:
        """Average message size per stream, from the last chunk each tail probe saw."""
        return dict(self.aio.message_size)

    def bounds(self, streams: Iterable[str]) -> dict[str, tuple[int, int] | None]:
        """(first offset, tail) per stream, concurrently; None for a stream that does not exist."""

        async def one(s: str) -> tuple[int, int] | None:
            try:
                return await self.aio.bounds(s)
            except StreamNotFoundError:
                return None

        async def all_bounds(names: list[str]) -> dict[str, tuple[int, int] | None]:
            return dict(zip(names, await asyncio.gather(*(one(s) for s in names)), strict=True))

        return self._run(all_bounds(list(streams)), "bounds")

    def tails(self, streams: Iterable[str]) -> dict[str, int]:
        async def all_tails(names: list[str]) -> dict[str, int]:
            values = await asyncio.gather(*(self.aio.tail(s) for s in names))
            return dict(zip(names, values, strict=True))

        return self._run(all_tails(list(streams)), "tails")

    def offset_for_timestamp(self, stream: str, timestamp_ms: int) -> int:
        return self._run(self.aio.offset_for_timestamp(stream, timestamp_ms), "offset_for_timestamp")

    def stored_offset(self, consumer: str, stream: str) -> int | None:
        return self._run(self.aio.stored_offset(consumer, stream), "stored_offset")

    def stored_offsets(self, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
        return self._run(self.aio.stored_offsets(consumer, streams), "stored_offsets")

    def store_offsets(self, consumer: str, offsets: Mapping[str, int]) -> None:
        self._run(self.aio.store_offsets(consumer, offsets), "store_offsets")

    def create_stream(self, stream: str, arguments: Mapping[str, Any] | None = None) -> None:
        self._run(self.aio.create_stream(stream, arguments), "create_stream")

    def delete_stream(self, stream: str) -> None:
        self._run(self.aio.delete_stream(stream), "delete_stream")

    def create_super_stream(
        self, name: str, partitions: int, arguments: Mapping[str, Any] | None = None
    ) -> None:
        self._run(self.aio.create_super_stream(name, partitions, arguments), "create_super_stream")

    def delete_super_stream(self, name: str) -> None:
        self._run(self.aio.delete_super_stream(name), "delete_super_stream")
