"""Broker metadata and offsets: an async client, and a sync facade over the process's loop thread.

`AsyncBrokerClient` works on whatever loop runs it (Airflow triggers use it directly);
`BrokerClient` runs the same coroutines on the loop thread of `loop.py`, so Spark's driver and
executors, Dagster and the CLI call plain functions. Connections come from `pool.py`; the
connection, retries and chunk probes (tails, positions in time) are the base class's,
`chunk_probes.ChunkProbes`.

`BrokerClient` is a one-line sync twin of each `AsyncBrokerClient` call, kept in this module so
that the two lists of calls stay the same: apart, a call added to one would be missed in the other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from rstream import exceptions as rx

from pyspark_rmqs.broker.chunk_probes import PROBE_TIMEOUT_S, ChunkProbes, StreamStats, TimeBound
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.pool import get_pool
from pyspark_rmqs.broker.protocol import OFFSET, STATS
from pyspark_rmqs.core.errors import (
    AccessRefusedError,
    BrokerTimeoutError,
    StreamNotFoundError,
    access_refused,
)

log = logging.getLogger(__name__)
R = TypeVar("R")

__all__ = [
    "PROBE_TIMEOUT_S",
    "AsyncBrokerClient",
    "BrokerClient",
    "StreamStats",
    "TimeBound",
    "parse_version",
]

STORE_PARALLELISM = 16
# The tracking reference `stamp_clock` stores: each store is a chunk the broker timestamps.
CLOCK_REFERENCE = "rmqs.clock"


@dataclass(frozen=True)
class PolledBounds:
    """What a polling check of some streams shares with the others of its poll (no consumer in it)."""

    streams: tuple[str, ...]
    firsts: tuple[int, ...]
    tails: tuple[int, ...]
    ids: tuple[tuple[int, int, int] | None, ...]  # where a stored offset may be reused; None: QueryOffset


class Polled(Protocol):
    """A stream or a super stream, as `core.target.Target` (this layer does not import it)."""

    @property
    def name(self) -> str: ...

    @property
    def is_super(self) -> bool: ...

    async def astreams(self, client: Any) -> list[str]: ...


_STATS = STATS
_OFFSET = OFFSET


async def _nothing(n: int) -> list[tuple[Any, type[Exception] | None]]:
    return [(None, rx.OffsetNotFound)] * n


def _stats(raw: tuple[int, int, int | None, int | None]) -> StreamStats:
    """A batched StreamStats answer (`protocol.STATS`) as `StreamStats`."""
    return StreamStats(first_chunk_id=raw[0], committed_chunk_id=raw[1], committed_offset=raw[3])


def _ids(raw: tuple[int, int, int | None, int | None]) -> tuple[int, int, int] | None:
    """(first, committed, last) chunk ids: what no store can leave unchanged; None if not reported."""
    return None if raw[2] is None else (raw[0], raw[1], raw[2])


def _stored(conn: Any, stream: str, value: Any, err: type[Exception] | None) -> int | None:
    """A QueryOffset answer: the stored offset, None where the consumer stored none."""
    if err is rx.OffsetNotFound:
        return None
    if err is not None:
        raise _stream_error(conn, err, stream, "read a stored offset on")
    return int(value)


def _stream_error(conn: Any, err: type[Exception], stream: str, doing: str) -> Exception:
    """The broker's answer code for one stream as the error the rstream path raised for it."""
    if issubclass(err, rx.StreamDoesNotExist):
        return StreamNotFoundError(f"stream '{stream}' does not exist")
    if issubclass(err, rx.AccessRefused):  # StreamStats and QueryOffset both need read
        return access_refused(conn, stream, "read", doing)
    return err()


def parse_version(text: str) -> tuple[int, int, int]:
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in text.split(".")[:3]]
    return tuple([*parts, 0, 0, 0][:3])  # type: ignore[return-value]


class AsyncBrokerClient(ChunkProbes):
    """Metadata, tails and stored offsets of streams and super streams, on the running loop
    (connection, retries and probes: `ChunkProbes`)."""

    async def broker_version(self) -> str:
        client = await self._locator()
        return (client.server_properties or {}).get("version", "0.0.0")

    async def stream_exists(self, stream: str) -> bool:
        return bool(await self._call(f"stream_exists({stream})", lambda c: c.stream_exists(stream)))

    async def partitions(self, superstream: str) -> list[str]:
        """The partition streams of a super stream, in the broker's order (which hash routing uses).

        One query for every caller on this loop that asks before it is written (`Lookups.partitions`):
        a triggerer's watchers of one super stream ask once per poll."""
        what = f"partitions({superstream})"
        since = time.monotonic()
        lookups = get_pool().lookups(self.conn)

        async def query() -> Any:
            return await self._call(what, lambda c: c.partitions(superstream))

        try:
            parts = await lookups.partitions(superstream, since, query)
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"super stream '{superstream}' does not exist") from e
        if not parts:
            raise StreamNotFoundError(f"super stream '{superstream}' does not exist or has no partitions")
        return list(parts)

    async def route(self, routing_key: str, superstream: str) -> list[str]:
        if routing_key is None:
            raise ValueError("route() needs a routing key, got None")
        return list(await self._call("route", lambda c: c.route(routing_key, superstream)))

    async def watermark_rows(
        self, streams: Sequence[str], consumer: str, *, since: float | None = None
    ) -> list[tuple[int, int, int | None]]:
        """(first offset, tail, stored offset of `consumer` or None) per stream, in order.

        The StreamStats and QueryOffset requests of all streams go out together through the loop's
        coalescing queue (`lookups.py`): pipelined on the shared metadata connection, and shared
        with other checks on this loop that asked for the same at the same time. `since` (a
        `time.monotonic()` no later than the caller's start) bounds how old a shared answer may be.
        A tail needs a subscription only where the broker reports no committed offset (before 4.3).
        An empty `consumer` asks for no stored offset. Polling checks use `polled_watermark_rows`.
        """
        names = list(streams)
        asked = time.monotonic() if since is None else since
        lookups = get_pool().lookups(self.conn)

        async def once() -> list[tuple[int, int, int | None]]:
            stats, stored = await asyncio.gather(
                self._answers(lookups, _STATS, names, "", asked),
                self._answers(lookups, _OFFSET, names, consumer, asked) if consumer else _nothing(len(names)),
            )
            firsts, tails = await self._bounds(lookups, names, stats, polling=False)
            offsets = [
                _stored(self.conn, s, value, err) for s, (value, err) in zip(names, stored, strict=True)
            ]
            return list(zip(firsts, tails, offsets, strict=True))

        return await self._retry(f"watermarks of {len(names)} stream(s)", once)

    async def polled_watermark_rows(
        self, target: Polled, consumer: str, since: float
    ) -> tuple[list[str], list[tuple[int, int, int | None]]]:
        """`target`'s streams and `watermark_rows` for a check that polls (triggers, sensors).

        The part no consumer changes (partitions, StreamStats, tails) is one run for every polling
        check of `target` on this loop that began before it (`Lookups.join`): a triggerer's
        watchers of one super stream share it each poll, and each adds only its consumer's stored
        offsets, reused at unchanged chunk ids (`OffsetCache`). A check waiting for it holds a few
        objects instead of its own requests: CPython promotes what is alive at a collection during
        the poll, and enough promoted objects make it collect the triggerer's whole heap (#33).
        """
        lookups = get_pool().lookups(self.conn)
        key = ("bounds", target.name, target.is_super)
        waiter = lookups.join(key, since)
        if waiter is None:  # the coroutine is made only here: most checks of a poll join
            waiter = lookups.begin(key, self._polled_bounds(target, lookups))
        b: PolledBounds = await waiter
        if not consumer:
            return list(b.streams), list(zip(b.firsts, b.tails, [None] * len(b.streams), strict=True))
        stored, need = lookups.offsets.of(consumer, b.streams, b.ids)
        if need:  # no closure here: its cells would be made for every check, even one that needs none
            await self._stored_into(stored, need, lookups, b, consumer)
        return list(b.streams), list(zip(b.firsts, b.tails, stored, strict=True))

    async def _polled_bounds(self, target: Polled, lookups: Any) -> PolledBounds:
        """`polled_watermark_rows`' shared part: streams, first offsets, tails, and the chunk ids at
        which a stored offset may be reused (StreamStats from the leader only, `leader_here`)."""
        streams = await target.astreams(self)

        async def once() -> PolledBounds:
            asked = time.monotonic()
            stats, led = await self._guarded(
                asyncio.gather(
                    lookups.answers(_STATS, streams, "", asked, self.timeout), lookups.leader_here(streams)
                )
            )
            firsts, tails = await self._bounds(lookups, streams, stats, polling=True)
            ids = [_ids(raw) if s in led else None for s, (raw, _err) in zip(streams, stats, strict=True)]
            return PolledBounds(tuple(streams), tuple(firsts), tuple(tails), tuple(ids))

        return await self._retry(f"watermarks of {len(streams)} stream(s)", once)

    async def _stored_into(
        self, stored: list[int | None], need: list[int], lookups: Any, b: PolledBounds, consumer: str
    ) -> None:
        """`stored[i]` for the indexes in `need`: QueryOffset written after `b`'s stats were answered
        (so an answer is never older than the chunk ids it is remembered at)."""
        names = [b.streams[i] for i in need]

        async def once() -> None:
            answers = await self._answers(lookups, _OFFSET, names, consumer, time.monotonic())
            for i, s, (value, err) in zip(need, names, answers, strict=True):
                stored[i] = offset = _stored(self.conn, s, value, err)
                key = b.ids[i]
                if key is not None:
                    lookups.offsets.put(s, consumer, key, offset)

        await self._retry(f"stored offsets of {len(need)} stream(s)", once)

    async def _answers(
        self, lookups: Any, kind: int, names: list[str], reference: str, since: float
    ) -> list[tuple[Any, type[Exception] | None]]:
        """`Lookups.answers`, `_guarded`."""
        return await self._guarded(lookups.answers(kind, names, reference, since, self.timeout))

    async def _guarded(self, aw: Awaitable[R]) -> R:
        """`await aw`; a timeout drops the metadata connection and is a `BrokerTimeoutError`."""
        try:
            return await aw
        except TimeoutError as e:
            await get_pool().drop_locator(self.conn)
            raise BrokerTimeoutError("watermarks: no answer from the broker") from e

    async def _bounds(
        self,
        lookups: Any,
        names: list[str],
        stats: list[tuple[Any, type[Exception] | None]],
        *,
        polling: bool,
    ) -> tuple[list[int], list[int]]:
        """(first offsets, tails) from StreamStats answers; a tail the stats do not tell is measured
        by a subscription, or with `polling` reused where measured at the same chunk ids."""
        firsts: list[int] = []
        tails: list[int] = []
        probes: dict[int, StreamStats] = {}
        for i, (s, (raw, err)) in enumerate(zip(names, stats, strict=True)):
            if err is not None:
                raise _stream_error(self.conn, err, s, "read the stats of")
            st = _stats(raw)
            tail = self._known_tail(st)
            if tail is None and polling:
                tail = lookups.tails.get(s, st.first_chunk_id, st.committed_chunk_id)
            if tail is None:
                probes[i] = st
            firsts.append(st.first_offset)
            tails.append(-1 if tail is None else tail)
        if probes:
            measured = await asyncio.gather(
                *(self._measured_tail(lookups, names[i], st) for i, st in probes.items())
            )
            for i, tail in zip(probes, measured, strict=True):
                tails[i] = tail
        return firsts, tails

    @staticmethod
    def _known_tail(st: StreamStats) -> int | None:
        """The tail when StreamStats alone tells it (4.3+, or an empty stream); None otherwise."""
        if st.committed_offset is not None:
            return st.committed_offset + 1
        if st.is_empty:
            return max(0, st.first_chunk_id)
        return None

    async def _measured_tail(self, lookups: Any, stream: str, st: StreamStats) -> int:
        """The tail by a subscription (`_tail`), one at a time per stream and chunk ids on this loop,
        at most `lookups.probes` at once; remembered for polling checks."""

        async def probe() -> int:
            async with lookups.probes:
                return await self._tail(stream, st)

        return int(await lookups.tails.measure(stream, st.first_chunk_id, st.committed_chunk_id, probe))

    async def stamp_clock(self, stream: str) -> None:
        """Make the broker timestamp a chunk of `stream` now, by its clock: an offset-tracking entry.

        Stores an offset for the tracking reference `CLOCK_REFERENCE` (the local time in epoch
        milliseconds, so that every stamp is a new value the read-back can confirm). It holds no
        messages and moves no consumer's offset; `time_bounds` then sees the broker's "now" on an
        idle stream, where no message would show that a time has passed.
        """
        await self.store_offsets(CLOCK_REFERENCE, {stream: time.time_ns() // 1_000_000})

    async def stored_offset(self, consumer: str, stream: str) -> int | None:
        """The broker-stored offset of `consumer` on `stream`; None when it stored none."""
        try:
            return int(await self._call("query_offset", lambda c: c.query_offset(stream, consumer)))
        except rx.OffsetNotFound:
            return None
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"stream '{stream}' does not exist") from e
        except rx.AccessRefused as e:
            raise access_refused(self.conn, stream, "read", "read a stored offset on") from e

    async def store_offset_unconfirmed(self, consumer: str, stream: str, offset: int) -> None:
        """StoreOffset alone (the protocol sends no reply): for callers that read back themselves."""
        await self._call("store_offset", lambda c: c.store_offset(stream, consumer, offset))

    async def stored_offsets(self, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
        names = list(streams)
        sem = asyncio.Semaphore(STORE_PARALLELISM)

        async def one(s: str) -> int | None:
            async with sem:
                return await self.stored_offset(consumer, s)

        values = await asyncio.gather(*(one(s) for s in names))
        return dict(zip(names, values, strict=True))

    async def publisher_sequences(self, producer: str, streams: Iterable[str]) -> dict[str, int]:
        """The last publishing id the broker stored for producer name `producer` on each stream (0: none).

        The broker drops a message of that producer name whose publishing id is at or below it.
        """
        names = list(streams)
        sem = asyncio.Semaphore(STORE_PARALLELISM)

        async def one(s: str) -> int:
            async with sem:
                try:
                    return int(
                        await self._call(
                            f"publisher sequence of '{producer}' on '{s}'",
                            lambda c: c.query_publisher_sequence(s, producer),
                        )
                    )
                except rx.StreamDoesNotExist as e:
                    raise StreamNotFoundError(f"stream '{s}' does not exist") from e

        values = await asyncio.gather(*(one(s) for s in names))
        return dict(zip(names, values, strict=True))

    async def store_offsets(self, consumer: str, offsets: Mapping[str, int]) -> None:
        """Store `consumer`'s offsets, concurrently with bounded parallelism; confirmed by a read-back.

        StoreOffset has no reply in the protocol, so each store is followed by a query: a store that
        returns has been applied. The broker drops a store silently where the user lacks read on the
        stream (measured on RabbitMQ 4.0); the query then is refused too, and says so.

        An offset below the stream's first offset is the exception: the broker keeps no tracking
        entry under it past the next segment roll, and the store's own tracking chunk may roll one
        (a full last segment), so the value can be gone before it is read back. That is the
        broker's rule, not a failed store: it returns (the caller's run record places the
        consumer), where waiting for the value failed every retry of a run resuming a range
        retention had overtaken.
        """
        sem = asyncio.Semaphore(STORE_PARALLELISM)

        async def one(stream: str, offset: int) -> None:
            async with sem:
                await self._call("store_offset", lambda c: c.store_offset(stream, consumer, offset))
                for _ in range(50):
                    try:
                        stored = await self.stored_offset(consumer, stream)
                    except AccessRefusedError as e:
                        raise access_refused(self.conn, stream, "read", "store an offset on") from e
                    if stored == offset:
                        return
                    if offset < (first := await self.first_offset(stream)):
                        log.info(
                            "stored offset %d of '%s' on '%s' is below the first offset %d: the broker "
                            "does not keep it",
                            offset,
                            consumer,
                            stream,
                            first,
                        )
                        return
                    await asyncio.sleep(0.02)
                raise BrokerTimeoutError(
                    f"stored offset of '{consumer}' on '{stream}' did not become {offset}"
                )

        await asyncio.gather(*(one(s, o) for s, o in offsets.items() if o >= 0))

    async def store_offsets_forward(self, consumer: str, offsets: Mapping[str, int]) -> dict[str, int]:
        """`store_offsets`, never moving a stored offset backwards: a value below the stored one is
        not stored; returns those streams with the offset they keep (a watermark never goes back)."""
        wanted = {s: o for s, o in offsets.items() if o >= 0}
        now = await self.stored_offsets(consumer, list(wanted))
        kept = {s: v for s, o in wanted.items() if (v := now[s]) is not None and o < v}
        if kept:
            log.warning(
                "not moving the stored offset of '%s' backwards on %s (stored, given): %s",
                consumer,
                sorted(kept),
                {s: (kept[s], wanted[s]) for s in sorted(kept)},
            )
        await self.store_offsets(consumer, {s: o for s, o in wanted.items() if s not in kept and o != now[s]})
        return kept

    async def create_stream(self, stream: str, arguments: Mapping[str, Any] | None = None) -> None:
        """Create `stream` ("already exists" is fine). RabbitMQ checks configure before it looks for
        the stream: without it, creating an existing stream is refused too (`ensure_stream` of
        `runs.record` asks whether it exists first)."""
        try:
            await self._call("create_stream", lambda c: c.create_stream(stream, dict(arguments or {})))
        except rx.StreamAlreadyExists:
            pass
        except rx.AccessRefused as e:
            raise access_refused(self.conn, stream, "configure", "create") from e

    async def delete_stream(self, stream: str) -> None:
        try:
            await self._call("delete_stream", lambda c: c.delete_stream(stream))
        except rx.StreamDoesNotExist:
            pass
        except rx.AccessRefused as e:
            raise access_refused(self.conn, stream, "configure", "delete") from e

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
        except rx.AccessRefused as e:
            raise access_refused(self.conn, name, "configure", "create the super stream") from e

    async def delete_super_stream(self, name: str) -> None:
        try:
            await self._call("delete_super_stream", lambda c: c.delete_super_stream(name))
        except rx.StreamDoesNotExist:
            pass
        except rx.AccessRefused as e:
            raise access_refused(self.conn, name, "configure", "delete the super stream") from e


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

    def find_message(
        self,
        stream: str,
        offset: int,
        match: Callable[[bytes], bool],
        *,
        max_chunks_past_retention: int | None = None,
    ) -> tuple[int, bytes] | None:
        return self._run(
            self.aio.find_message(stream, offset, match, max_chunks_past_retention=max_chunks_past_retention),
            "find_message",
        )

    def oldest_chunks(self, streams: Iterable[str]) -> dict[str, tuple[int, int] | None]:
        """(first offset, timestamp) of the oldest chunk kept per stream, concurrently (`oldest_chunk`)."""

        async def all_chunks(names: list[str]) -> dict[str, tuple[int, int] | None]:
            found = await asyncio.gather(*(self.aio.oldest_chunk(s) for s in names))
            return dict(zip(names, found, strict=True))

        return self._run(all_chunks(list(streams)), "oldest_chunks")

    def time_bounds(self, streams: Iterable[str], timestamps_ms: Sequence[int]) -> dict[str, list[TimeBound]]:
        """`time_bounds` of every stream at the same ascending times, the streams concurrently."""

        async def all_bounds(names: list[str]) -> dict[str, list[TimeBound]]:
            found = await asyncio.gather(*(self.aio.time_bounds(s, timestamps_ms) for s in names))
            return dict(zip(names, found, strict=True))

        # A lookup per time and stream (a long backfill has thousands): the backstop grows with them.
        return run_sync(all_bounds(list(streams)), self._timeout + 10.0 * len(timestamps_ms), "time_bounds")

    def stamp_clock(self, streams: Iterable[str]) -> None:
        """`stamp_clock` on every stream, concurrently."""

        async def stamp(names: list[str]) -> None:
            await asyncio.gather(*(self.aio.stamp_clock(s) for s in names))

        self._run(stamp(list(streams)), "stamp_clock")

    def stored_offset(self, consumer: str, stream: str) -> int | None:
        return self._run(self.aio.stored_offset(consumer, stream), "stored_offset")

    def stored_offsets(self, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
        return self._run(self.aio.stored_offsets(consumer, streams), "stored_offsets")

    def store_offsets(self, consumer: str, offsets: Mapping[str, int]) -> None:
        self._run(self.aio.store_offsets(consumer, offsets), "store_offsets")

    def store_offsets_forward(self, consumer: str, offsets: Mapping[str, int]) -> dict[str, int]:
        return self._run(self.aio.store_offsets_forward(consumer, offsets), "store_offsets")

    def publisher_sequences(self, producer: str, streams: Iterable[str]) -> dict[str, int]:
        return self._run(self.aio.publisher_sequences(producer, streams), "publisher_sequences")

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
