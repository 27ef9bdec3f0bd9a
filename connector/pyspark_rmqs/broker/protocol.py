"""What rstream lacks, on rstream's own framing: StreamStats, and a connection that reads whole frames.

rstream 1.1.1 reads the socket 256 bytes at a time and knows no StreamStats (key 0x001c): its
frame registry would raise on the reply and kill the connection's listener. `RmqsClient` swaps in
a connection that reads each frame with one `readexactly` and decodes StreamStats itself; every
other frame still goes through rstream's decoder, handlers and waiters.

Metadata checks over many streams (StreamStats and QueryOffset, one stream per request: the protocol
has no batched form of either) go through `send_batch`: the requests are encoded here with `struct`,
written with one socket write per window and answered into one `Batch` with one future for all of
them. rstream's `sync_request` costs per request a future, two `wait_for` tasks, a reflective
encode and decode and a socket write with `drain` (~100 us of this process's CPU, measured), which
made a 500-partition check wait on Python rather than on the broker.
"""

from __future__ import annotations

import asyncio
import io
import ssl
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rstream import schema
from rstream.client import Client
from rstream.connection import Connection, ConnectionClosed
from rstream.constants import Key, T
from rstream.encoding import _decode_struct, decode_frame

from pyspark_rmqs.core.chunks import CorruptChunkData

STREAM_STATS_KEY = 0x001C
QUERY_OFFSET_KEY = Key.QueryOffset.value
DELIVER_KEY = Key.Deliver.value
CONFIRM_KEY = Key.PublishConfirm.value
_RESPONSE_BIT = 0x8000
# Deliver v1: subscription id, then the osiris chunk header; the chunk data follows.
_DELIVER = struct.Struct(">BbbHIqQQIIII")
_DATA_AT = 4 + _DELIVER.size


@dataclass(slots=True)
class Chunk:
    """One delivered chunk: the unit the reader works on (never one object per message)."""

    subscription_id: int
    chunk_type: int
    num_entries: int
    num_records: int
    timestamp: int  # epoch millis
    first_offset: int
    data: bytes

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.num_records


class _Delivered:
    """What the connection hands rstream's listener for a Deliver frame it already dispatched."""

    key = Key.Deliver
    corr_id = None


_DELIVERED = _Delivered()


class _Confirmed:
    key = Key.PublishConfirm
    corr_id = None


_CONFIRMED = _Confirmed()


class _Answered:
    """What the connection hands rstream's listener for an answer it gave to a `Batch` itself."""

    key = None
    corr_id = None


_ANSWERED = _Answered()
STATS = 0
"""A `send_batch` request kind: StreamStats of a stream (answer: (first_chunk_id,
committed_chunk_id, last_chunk_id or None, committed_offset or None))."""
OFFSET = 1
"""A `send_batch` request kind: QueryOffset of a reference on a stream (answer: the offset)."""
_RESPONSE_CODE_OK = 1
_U16 = struct.Struct(">H")
_HEAD = struct.Struct(">IHHI")  # size, key, version, correlation id
_STAT = struct.Struct(">q")


class Batch:
    """Pipelined requests answered into one future (`done`): `values[i]` or `errors[i]` per request.

    Requests are added (`add`) until the batch is sent; `done` resolves once every added request
    is answered. An error is the broker's response code as rstream's exception class (its
    `ServerError` registry), so callers map codes exactly as the rstream path did. A lost
    connection or a timeout fails `done` as a whole.
    """

    __slots__ = ("corr_ids", "done", "errors", "left", "values")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.values: list[Any] = []
        self.errors: list[type[Exception] | None] = []
        self.left = 0
        self.done: asyncio.Future[None] = loop.create_future()
        self.corr_ids: list[int] = []

    def add(self) -> int:
        """A slot for one more request; its index."""
        self.values.append(None)
        self.errors.append(None)
        self.left += 1
        return len(self.values) - 1

    def answer(self, index: int, value: Any, error: type[Exception] | None) -> None:
        self.values[index] = value
        self.errors[index] = error
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    @property
    def failed(self) -> bool:
        return future_failed(self.done)


def future_failed(fut: asyncio.Future[Any]) -> bool:
    """Done without a result (cancelled, or an exception): an answer no later asker may join."""
    return fut.done() and (fut.cancelled() or fut.exception() is not None)


def _string(text: str) -> bytes:
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def _decode_answer(kind: int, data: bytearray) -> tuple[Any, type[Exception] | None]:
    """The value or error class of a StreamStats / QueryOffset response frame (`data` after the size)."""
    code = int.from_bytes(data[8:10], "big")
    if code != _RESPONSE_CODE_OK:
        return None, rx_from_code(code)
    if kind == OFFSET:
        return int.from_bytes(data[10:18], "big"), None
    # (first_chunk_id, committed_chunk_id, last_chunk_id, committed_offset): a tuple of ints and no
    # key strings, since a poll of many triggers decodes thousands (fewer objects, shorter GC pauses)
    first, committed, last, offset = -1, -1, None, None
    count = int.from_bytes(data[10:14], "big", signed=True)
    at = 14
    for _ in range(max(0, count)):
        n = int.from_bytes(data[at : at + 2], "big")
        value = _STAT.unpack_from(data, at + 2 + n)[0]
        if n == 14 and data.startswith(b"first_chunk_id", at + 2):
            first = value
        elif n == 18 and data.startswith(b"committed_chunk_id", at + 2):
            committed = value
        elif n == 13 and data.startswith(b"last_chunk_id", at + 2):
            last = value
        elif n == 16 and data.startswith(b"committed_offset", at + 2):
            offset = value
        at += 10 + n
    return (first, committed, last, offset), None


def rx_from_code(code: int) -> type[Exception]:
    """rstream's exception class for a response code (what `check_response_code` would raise)."""
    from rstream.exceptions import ServerError

    return ServerError.from_code(code)


_CONNECT_TIMEOUT_S = 10.0
_YIELD_EVERY = 256
"""Frames read back to back before the reader lets the loop run others: `readexactly` returns
without suspending while the buffer holds a frame, and a burst of 5,000 answers is ~50 ms."""


class _Key:
    """Stands in for an rstream `Key` member: the enum cannot be extended, only `.value` is read."""

    def __init__(self, value: int, name: str) -> None:
        self.value = value
        self.name = name

    def __repr__(self) -> str:
        return f"<Key.{self.name}: {self.value}>"


_STREAM_STATS = _Key(STREAM_STATS_KEY, "StreamStats")


@dataclass
class StreamStatsRequest(schema.Frame):
    key = _STREAM_STATS  # type: ignore[assignment]
    correlation_id: int = field(metadata={"type": T.uint32})
    stream: str = field(metadata={"type": T.string})


@dataclass
class StreamStatsResponse(schema.Frame, is_response=True):
    key = _STREAM_STATS  # type: ignore[assignment]
    correlation_id: int = field(metadata={"type": T.uint32})
    response_code: int = field(metadata={"type": T.uint16})
    stats: list[Any] = field(metadata={"type": [T.string, T.int64]})


StreamStatsRequest.prepare()
StreamStatsResponse.prepare()


class FrameConnection(Connection):
    """rstream's connection, reading each frame whole and decoding the frames rstream does not know."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(host, port, ssl_context)
        self.batched: dict[int, tuple[Batch, int, int]] = {}
        """Correlation id -> (batch, index, kind) of the `send_batch` requests waiting for an answer."""
        self.room = asyncio.Event()
        """Set once no more than `low_water` batched requests wait: a window's sender goes on."""
        self.low_water = 0
        self._unyielded = 0

    async def open(self) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(host=self.host, port=self.port, ssl=self._ssl_context, limit=1 << 20),
                timeout=_CONNECT_TIMEOUT_S,
            )
        except TimeoutError as e:
            raise ConnectionError(f"could not connect to {self.host}:{self.port} (timed out)") from e

    tls_error: ssl.SSLError | None = None
    """A TLS alert that ended the connection, e.g. the broker refusing a client certificate (TLS 1.3
    reports that after the handshake, on the first read)."""

    async def _read_frame_raw(self) -> bytearray:
        assert self._reader is not None
        try:
            header = await self._reader.readexactly(4)
            return await self._reader.readexactly(int.from_bytes(header, "big"))  # type: ignore[return-value]
        except (asyncio.IncompleteReadError, ConnectionResetError) as e:
            raise ConnectionClosed from e
        except ssl.SSLError as e:
            self.tls_error = e
            raise

    deliver: Callable[[Chunk], None] | None = None
    confirm: Callable[[int, tuple[int, ...]], None] | None = None
    verify_crc: bool = True

    async def read_frame(self) -> schema.Frame:
        self._unyielded += 1
        if self._unyielded >= _YIELD_EVERY:  # frames already buffered are read without a pause:
            self._unyielded = 0  # let the loop's other tasks run between bursts
            await asyncio.sleep(0)
        data = await self._read_frame_raw()
        key = int.from_bytes(data[0:2], "big")
        if key == STREAM_STATS_KEY | _RESPONSE_BIT or key == QUERY_OFFSET_KEY | _RESPONSE_BIT:
            waiting = self.batched.pop(int.from_bytes(data[4:8], "big"), None)
            if waiting is not None:
                batch, index, kind = waiting
                batch.answer(index, *_decode_answer(kind, data))
                if len(self.batched) <= self.low_water:
                    self.room.set()
                return _ANSWERED  # type: ignore[return-value]
        if key == DELIVER_KEY:
            return self._on_deliver(data)  # type: ignore[return-value]
        if key == CONFIRM_KEY and self.confirm is not None:
            # publisher id (uint8), count (int32), publishing ids (uint64 each): decoded in one call
            publisher_id = data[4]
            count = int.from_bytes(data[5:9], "big")
            self.confirm(publisher_id, struct.unpack_from(f">{count}Q", data, 9))
            return _CONFIRMED  # type: ignore[return-value]
        if key == STREAM_STATS_KEY | _RESPONSE_BIT:
            return _decode_struct(io.BytesIO(bytes(data[4:])), StreamStatsResponse)  # type: ignore[return-value]
        return decode_frame(bytes(data))

    def _on_deliver(self, data: bytearray) -> _Delivered:
        sub, _magic, ctype, entries, records, ts, _epoch, first, crc, size, _trailer, _r = (
            _DELIVER.unpack_from(data, 4)
        )
        chunk_data = bytes(data[_DATA_AT : _DATA_AT + size])
        problem = _corruption(chunk_data, size, crc if self.verify_crc else None)
        if problem is not None:  # not raised here: that would kill the listener, not fail the read
            chunk_data = CorruptChunkData(chunk_data, problem)
        if self.deliver is not None:
            self.deliver(Chunk(sub, ctype, entries, records, ts, first, chunk_data))
        return _DELIVERED


def _corruption(data: bytes, size: int, crc: int | None) -> str | None:
    """What is wrong with a delivered chunk's data, or None; `crc` None skips the CRC check."""
    if len(data) != size:
        return f"the frame holds {len(data)} of the chunk's {size} data bytes"
    if crc is not None:
        actual = zlib.crc32(data)
        if actual != crc:
            return f"CRC-32 mismatch (the chunk header says 0x{crc:08x}, its data has 0x{actual:08x})"
    return None


def _ignore_closed(_info: Any) -> None:
    return None


class RmqsClient(Client):
    """An rstream `Client` on a `FrameConnection`, with the commands rstream lacks."""

    def __init__(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None, **kw: Any) -> None:
        kw.setdefault("frame_max", 8 * 1024 * 1024)
        kw.setdefault("heartbeat", 60)
        # A handler (even a no-op) keeps rstream from logging a traceback for every closed socket;
        # callers notice dead connections through is_connection_alive().
        kw.setdefault("connection_closed_handler", _ignore_closed)
        super().__init__(host, port, ssl_context=ssl_context, **kw)
        self.requested_frame_max: int = kw["frame_max"]  # before the tune: frame_max is then the minimum
        self.deliver_sinks: dict[int, Callable[[Chunk], None]] = {}
        self.confirm_sinks: dict[int, Callable[[tuple[int, ...]], None]] = {}
        # Called (on the loop) once the connection is gone: waiters that only wake on frames (a
        # publisher waiting for confirms) learn it at once, not at their timeout. A node killed
        # outright sends no frame first, only a closed socket.
        self.on_closed: dict[str, Callable[[], None]] = {}
        self.on_closed["batches"] = self._fail_batches
        self.batch_requests = 0
        """StreamStats / QueryOffset requests sent through `send_batch` (tests and benches count them)."""

    async def send_batch(self, batch: Batch, requests: list[tuple[int, int, str, str]], window: int) -> None:
        """Send `requests` ((index in `batch`, kind `STATS` / `OFFSET`, stream, reference)); their
        answers go into `batch` (await `batch.done`, bounded by the caller).

        At most `window` of them (all batches together) wait for an answer on this connection at a
        time: each write carries as many as there is room for, and the next one waits until half
        the window was answered. One write per window, not one per request.
        """
        conn = self._conn
        assert isinstance(conn, FrameConnection) and conn._writer is not None
        at = 0
        while at < len(requests):
            if not self.is_connection_alive():
                batch.fail(ConnectionError("the metadata connection is closed"))
                return
            room = window - len(conn.batched)
            if room <= 0:
                conn.low_water = window // 2
                conn.room.clear()
                await conn.room.wait()
                continue
            out = bytearray()
            for index, kind, stream, reference in requests[at : at + room]:
                corr = self._corr_id_seq.next()
                if kind == STATS:
                    body = _string(stream)
                    out += _HEAD.pack(8 + len(body), STREAM_STATS_KEY, 1, corr) + body
                else:
                    body = _string(reference) + _string(stream)
                    out += _HEAD.pack(8 + len(body), QUERY_OFFSET_KEY, 1, corr) + body
                conn.batched[corr] = (batch, index, kind)
                batch.corr_ids.append(corr)
            sent = min(room, len(requests) - at)
            at += sent
            self.batch_requests += sent
            await conn._write_frame_raw(bytes(out))  # one write (and drain) for the whole window

    def forget(self, batch: Batch) -> None:
        """Drop the unanswered requests of `batch` (it timed out): late answers are then ignored."""
        conn = self._conn
        if isinstance(conn, FrameConnection):
            for corr in batch.corr_ids:
                conn.batched.pop(corr, None)

    def _fail_batches(self) -> None:
        conn = self._conn
        if not isinstance(conn, FrameConnection):
            return
        waiting = {id(b): b for b, _, _ in conn.batched.values()}
        conn.batched.clear()
        conn.room.set()
        for batch in waiting.values():
            batch.fail(ConnectionError("the metadata connection was lost"))

    def _dispatch_confirm(self, publisher_id: int, ids: tuple[int, ...]) -> None:
        sink = self.confirm_sinks.get(publisher_id)
        if sink is not None:
            sink(ids)

    async def send_raw(self, frame: bytes) -> None:
        """Write an already encoded frame (publishing builds its frames itself, in one buffer)."""
        assert self._conn is not None
        await self._conn._write_frame_raw(frame)

    def busy(self) -> bool:
        """A request awaits its answer, or a subscription is open: closing it now would break a caller."""
        return bool(self._waiters) or bool(self.deliver_sinks)

    def _dispatch(self, chunk: Chunk) -> None:
        sink = self.deliver_sinks.get(chunk.subscription_id)
        if sink is not None:
            sink(chunk)

    def alloc_subscription_id(self) -> int:
        for i in range(256):
            if i not in self.deliver_sinks:
                return i
        raise RuntimeError("no free subscription id on this connection")

    async def start(self) -> None:
        assert self._conn is None
        conn = FrameConnection(self.host, self.port, self._ssl_context)
        conn.deliver = self._dispatch
        conn.confirm = self._dispatch_confirm
        self._conn = conn
        await conn.open()
        self.start_task("listener", self._listen(conn))
        self.add_handler(schema.Heartbeat, self._on_heartbeat)
        self.add_handler(schema.Close, self._on_close)

    async def _listen(self, conn: FrameConnection) -> None:
        """rstream's listener; when a TLS alert ends it, pending requests fail with that alert at once
        (rstream would leave them to time out)."""
        await self._listener()
        for callback in list(self.on_closed.values()):
            callback()
        error = conn.tls_error
        if error is not None:
            for fut in list(self._waiters.values()):
                if not fut.done():
                    fut.set_exception(error)

    async def stream_stats(self, stream: str) -> dict[str, int]:
        """StreamStats (RabbitMQ 3.11+): first_chunk_id, committed_chunk_id; committed_offset on 4.3+."""
        resp = await self.sync_request(
            StreamStatsRequest(self._corr_id_seq.next(), stream=stream), resp_schema=StreamStatsResponse
        )
        return {k: v for k, v in resp.stats}
