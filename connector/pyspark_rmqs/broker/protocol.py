"""What rstream lacks, on rstream's own framing: StreamStats, and a connection that reads whole frames.

rstream 1.1.1 reads the socket 256 bytes at a time and knows no StreamStats (key 0x001c): its
frame registry would raise on the reply and kill the connection's listener. `RmqsClient` swaps in
a connection that reads each frame with one `readexactly` and decodes StreamStats itself; every
other frame still goes through rstream's decoder, handlers and waiters.
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
_CONNECT_TIMEOUT_S = 10.0


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
        data = await self._read_frame_raw()
        key = int.from_bytes(data[0:2], "big")
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

    def _dispatch_confirm(self, publisher_id: int, ids: tuple[int, ...]) -> None:
        sink = self.confirm_sinks.get(publisher_id)
        if sink is not None:
            sink(ids)

    async def send_raw(self, frame: bytes) -> None:
        """Write an already encoded frame (publishing builds its frames itself, in one buffer)."""
        assert self._conn is not None
        await self._conn._write_frame_raw(frame)

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
