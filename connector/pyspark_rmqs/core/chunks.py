"""Chunk entries, both ways: a chunk's data -> its messages, and messages -> sub-entry batches.

A chunk holds entries: simple ones (one message each) and sub-entry batches (several messages in
one entry, compressed or not). Reading: `chunk_records` splits a chunk into one message per offset,
`chunk_bodies` takes only the bodies of a slice (the fixed columns' fast path); decompression is
bounded (`MAX_CHUNK_UNCOMPRESSED_BYTES`, each sub-entry into at most its declared size). Writing:
`sub_entry` builds one batch entry, compressed with `compress` as the Java client writes it.

A core module (no broker I/O): `batches.py` builds Arrow columns from chunks and `broker/protocol.py`
flags corrupt chunks with `CorruptChunkData`; the publish frames that carry entries are `broker/frames.py`.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

from pyspark_rmqs.core.codec import bodies
from pyspark_rmqs.core.errors import DataError

try:  # the vectorised check of a batch's bodies (bodies_array); the per-record path without it
    import numpy as _np
except ImportError:  # pragma: no cover - numpy comes with pandas/pyspark, not with the base install
    _np = None  # type: ignore[assignment]

VECTORISED = _np is not None
"""Fixed columns: record positions now, bodies checked and gathered per batch (`bodies_array`).
False (no numpy) keeps `chunk_bodies`, record by record; both give the same batches."""

_U32 = struct.Struct(">I")
SUB_ENTRY_HEADER = struct.Struct(">BHII")  # type|compression, records, uncompressed length, length

COMPRESSION_CODES = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_COMPRESSION_NAMES = {code: name for name, code in COMPRESSION_CODES.items()}

MAX_CHUNK_UNCOMPRESSED_BYTES = 256 << 20
"""Ceiling on the uncompressed bytes of one chunk's sub-entry batches, all together.

A sub-entry header declares its uncompressed size (up to 4 GiB) and any producer can write one, so
without a ceiling a few kilobytes of compressed zeros could exhaust an executor's memory. A chunk
arrives in one frame of at most a few MiB; 256 MiB allows a 32-fold expansion of an 8 MiB chunk,
more than real message batches reach. Each sub-entry is decompressed into a buffer of its declared
size (plus one byte, to notice more), so this is also the most one chunk can ever allocate.
"""


class CorruptChunkData(bytes):
    """A chunk's data that the connection found corrupt (CRC mismatch, cut short).

    It still travels the normal way, so the reader's offsets and credits stay right; reading it
    raises DataError with `corruption`, where the stream and offset are known.
    """

    corruption: str

    def __new__(cls, data: bytes, corruption: str) -> CorruptChunkData:
        self = super().__new__(cls, data)
        self.corruption = corruption
        return self


def _check_not_flagged(data: bytes | memoryview) -> None:
    if isinstance(data, CorruptChunkData):
        raise DataError(f"corrupt chunk: {data.corruption}")


def _too_big(size: int) -> DataError:
    """The decompressor produced more than `size` bytes: the declared size lies (or a bomb)."""
    return DataError(f"sub-entry decompresses to more than its declared {size} uncompressed bytes")


def _gunzip(data: bytes | memoryview, size: int) -> bytes | memoryview:
    """At most `size + 1` bytes of a gzip stream (several members allowed, as gzip allows)."""
    out = bytearray()
    rest = bytes(data)
    while True:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += member.decompress(rest, size + 1 - len(out))  # max_length >= 1: 0 would mean "no limit"
        if len(out) > size:
            raise _too_big(size)
        if not member.eof:
            raise DataError("sub-entry holds a truncated gzip stream")
        rest = member.unused_data
        if not rest:
            return memoryview(out)


# The Java and Go clients write the framed formats (snappy framing format, LZ4 frame); raw snappy and
# LZ4 blocks are still read for data written without framing.
_SNAPPY_FRAMED = b"\xff\x06\x00\x00sNaPpY"
_LZ4_FRAME = b"\x04\x22\x4d\x18"


def _stream_into(decompress_into: Callable[[bytes, bytearray], int], data: bytes, size: int) -> memoryview:
    """Stream-decompress into a buffer of `size + 1` bytes: the decompressor never holds more."""
    buf = bytearray(size + 1)
    try:
        n = decompress_into(data, buf)
    except Exception as e:
        if "whole buffer" in str(e):  # cramjam: the output did not fit
            raise _too_big(size) from None
        raise
    if n > size:
        raise _too_big(size)
    return memoryview(buf)[:n]


def _unsnappy(data: bytes | memoryview, size: int) -> bytes | memoryview:
    import cramjam

    raw = bytes(data)
    if raw.startswith(_SNAPPY_FRAMED):
        return _stream_into(cramjam.snappy.decompress_into, raw, size)
    claimed = _snappy_length(raw)  # a raw block starts with its length: check it before allocating
    if claimed != size:
        raise DataError(f"sub-entry declares {size} uncompressed bytes but its snappy block claims {claimed}")
    buf = bytearray(size)
    return memoryview(buf)[: cramjam.snappy.decompress_raw_into(raw, buf)]


def _unlz4(data: bytes | memoryview, size: int) -> bytes | memoryview:
    import cramjam

    raw = bytes(data)
    if raw.startswith(_LZ4_FRAME):
        return _stream_into(cramjam.lz4.decompress_into, raw, size)
    buf = bytearray(size)  # a block is decoded whole: into exactly the declared size, never more
    return memoryview(buf)[: cramjam.lz4.decompress_block_into(raw, buf, output_len=size)]


def _unzstd(data: bytes | memoryview, size: int) -> bytes | memoryview:
    import cramjam

    return _stream_into(cramjam.zstd.decompress_into, bytes(data), size)


def _snappy_length(raw: bytes) -> int:
    """The uncompressed length a raw snappy block starts with (a varint)."""
    n = 0
    for i, byte in enumerate(raw[:5]):
        n |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return n
    raise DataError("sub-entry holds an invalid snappy block")


_DECOMPRESS: dict[int, Callable[[bytes | memoryview, int], bytes | memoryview]] = {
    1: _gunzip,
    2: _unsnappy,
    3: _unlz4,
    4: _unzstd,
}


def _inflate(codec: int, payload: memoryview, declared: int) -> memoryview:
    """A sub-entry's payload uncompressed: exactly `declared` bytes, or DataError."""
    if codec == 0:
        out: bytes | memoryview = payload
    else:
        fn = _DECOMPRESS.get(codec)
        if fn is None:
            raise DataError(f"unknown sub-entry compression code {codec}")
        try:
            out = fn(payload, declared)
        except DataError:
            raise
        except Exception as e:  # zlib.error, cramjam.DecompressionError, ...
            raise DataError(f"cannot decompress a sub-entry ({_COMPRESSION_NAMES[codec]}): {e}") from e
    if len(out) != declared:
        raise DataError(
            f"sub-entry declares {declared} uncompressed bytes but holds {len(out)} "
            f"({_COMPRESSION_NAMES[codec]})"
        )
    return out if isinstance(out, memoryview) else memoryview(out)


def chunk_records(data: bytes | memoryview, num_entries: int) -> list[memoryview]:
    """The messages of a chunk, one per offset, in order; DataError when the chunk is corrupt.

    Corrupt means: an entry or message that runs past its chunk or batch, bytes left over after
    the last entry, a sub-entry that does not decompress to exactly its declared size, or
    declared sizes above `MAX_CHUNK_UNCOMPRESSED_BYTES`. A corrupt chunk is never shortened: which
    message is which offset cannot be known, whatever `strictDecoding` says.
    """
    _check_not_flagged(data)
    try:
        return _chunk_records(data, num_entries)
    except (IndexError, struct.error) as e:
        raise DataError(f"corrupt chunk: its {num_entries} entries do not fit its {len(data)} bytes") from e


def _chunk_records(data: bytes | memoryview, num_entries: int) -> list[memoryview]:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    n = len(mv)
    out: list[memoryview] = []
    append = out.append
    unpack = _U32.unpack_from
    budget = MAX_CHUNK_UNCOMPRESSED_BYTES
    pos = 0
    for i in range(num_entries):
        if mv[pos] & 0x80 == 0:
            (size,) = unpack(mv, pos)
            pos += 4
            if pos + size > n:
                raise DataError(f"corrupt chunk: entry {i} needs {size} bytes, {n - pos} are left")
            append(mv[pos : pos + size])
            pos += size
            continue
        kind, records, uncompressed, size = SUB_ENTRY_HEADER.unpack_from(mv, pos)
        pos += SUB_ENTRY_HEADER.size
        if pos + size > n:
            raise DataError(f"corrupt chunk: sub-entry {i} needs {size} bytes, {n - pos} are left")
        if uncompressed > budget:
            raise DataError(
                f"sub-entry {i} claims {uncompressed} uncompressed bytes, more than the "
                f"{MAX_CHUNK_UNCOMPRESSED_BYTES} bytes a chunk may expand to (MAX_CHUNK_UNCOMPRESSED_BYTES)"
            )
        budget -= uncompressed
        payload = _inflate((kind & 0x70) >> 4, mv[pos : pos + size], uncompressed)
        pos += size
        _batch_records(payload, records, i, out)
    if pos != n:
        raise DataError(f"corrupt chunk: {n - pos} bytes are left after its {num_entries} entries")
    return out


def _batch_records(payload: memoryview, count: int, entry: int, out: list[memoryview]) -> None:
    """Append the `count` messages of a sub-entry batch; they must fill its payload exactly."""
    n = len(payload)
    unpack = _U32.unpack_from
    pos = 0
    for j in range(count):
        (size,) = unpack(payload, pos)
        pos += 4
        if pos + size > n:
            raise DataError(f"corrupt sub-entry {entry}: message {j} needs {size} bytes, {n - pos} are left")
        out.append(payload[pos : pos + size])
        pos += size
    if pos != n:
        raise DataError(f"corrupt sub-entry {entry}: {n - pos} bytes are left after its {count} messages")


_DATA8 = b"\x00\x53\x75\xa0"
_DATA32 = b"\x00\x53\x75\xb0"


def chunk_bodies(data: bytes, num_entries: int, skip: int, take: int) -> list[bytes]:
    """Bodies of records `[skip, skip + take)` of a chunk: the fixed-columns fast path.

    One pass over the chunk, no object per message but the body itself. A message that is exactly
    one data section is sliced directly; anything else (other sections, sub-entry batches, invalid
    AMQP) goes through `chunk_records` and `bodies`. Records past `skip + take` are not looked at;
    a record the chunk's bytes cannot hold is a DataError, never a shorter body.
    """
    _check_not_flagged(data)
    stop = skip + take
    out: list[bytes] = []
    append = out.append
    unpack = _U32.unpack_from
    startswith = data.startswith
    n = len(data)
    pos = 0
    i = 0
    while i < stop:
        try:
            (size,) = unpack(data, pos)
        except struct.error as e:
            raise DataError(f"corrupt chunk: fewer than {stop} records in its {n} bytes") from e
        if size & 0x80000000:  # a sub-entry batch: take the general path for the whole chunk
            return bodies(chunk_records(data, num_entries)[skip:stop])
        p = pos + 4
        pos = p + size
        if pos > n:
            raise DataError(f"corrupt chunk: entry {i} needs {size} bytes, {max(n - p, 0)} are left")
        if i >= skip:
            # The bounds keep the length reads inside this record.
            if startswith(_DATA8, p, pos - 1) and data[p + 4] + 5 == size:
                append(data[p + 5 : pos])
            elif startswith(_DATA32, p, pos - 4) and unpack(data, p + 4)[0] + 8 == size:
                append(data[p + 8 : pos])
            else:
                append(bodies([memoryview(data)[p:pos]])[0])
        i += 1
    return out


def body_spans(data: bytes, skip: int, take: int) -> list[int] | None:
    """Where records `[skip, skip + take)` of a chunk of simple entries start: `take + 1` positions
    (the last is where the last record ends), each the position of a record's 4-byte size.

    The innermost loop of a read, kept to one unpack and one add per record: checking what each
    record holds is left to `bodies_array`, once per batch. None when the chunk is flagged corrupt,
    holds a sub-entry batch, or its records do not fit its bytes: `chunk_bodies` then tells why.
    """
    if isinstance(data, CorruptChunkData):
        return None
    stop = skip + take
    unpack = _U32.unpack_from
    pos = 0
    try:
        for _ in range(skip):
            pos += 4 + unpack(data, pos)[0]
        spans = [pos]
        append = spans.append
        for _ in range(take):
            pos += 4 + unpack(data, pos)[0]
            append(pos)
    except struct.error:  # past the end: a sub-entry's flagged size, or a corrupt chunk
        return None
    if pos > len(data) or len(spans) != take + 1 or stop < 0:
        return None
    return spans


def bodies_array(pieces: Sequence[tuple[bytes, list[int]]]) -> Any:
    """The bodies of the records `body_spans` found, as one Arrow binary array, in order.

    With numpy: one vectorised check that every record is exactly one small data section, then one
    C-level gather of the bodies; a batch with any other record takes the per-record path for all
    its records. Without numpy, the per-record path. Both give the same bodies as `chunk_bodies`.
    """
    if _np is not None and pieces:
        out = _bodies_numpy(pieces)
        if out is not None:
            return out
    values: list[bytes] = []
    for data, spans in pieces:
        values.extend(_span_bodies(data, spans))
    return binary_array(values)


_BINARY_LIMIT = 2**31 - 1  # int32 offsets: past that, pa.array (a chunked or large result)


def binary_array(values: Sequence[bytes]) -> Any:
    """`pa.array(values, pa.binary())` built from buffers: the same array, without pandas.

    pyarrow imports pandas, when it is installed, on its first `pa.array` (and `pa.scalar`,
    `to_numpy`) call in a process: 0.6-0.7 s once per process, paid by every Spark-free task and
    every new Spark Python worker that reads; the read path builds its columns from buffers instead.
    """
    import pyarrow as pa

    data = b"".join(values)
    n = len(values)
    if len(data) > _BINARY_LIMIT:
        return pa.array(values, pa.binary())
    offsets: Any
    if _np is not None:  # half the time of the pure-Python running sum; pa.array's is half again
        offsets = _np.zeros(n + 1, _np.int32)
        _np.cumsum(_np.fromiter(map(len, values), _np.int32, count=n), out=offsets[1:])
    else:
        offsets = array("i", accumulate(map(len, values), initial=0))
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _span_bodies(data: bytes, spans: list[int]) -> list[bytes]:
    """The per-record path: what `chunk_bodies` slices or decodes for each record of `spans`."""
    out: list[bytes] = []
    unpack = _U32.unpack_from
    startswith = data.startswith
    for k in range(len(spans) - 1):
        p = spans[k] + 4
        pos = spans[k + 1]
        size = pos - p
        if startswith(_DATA8, p, pos - 1) and data[p + 4] + 5 == size:
            out.append(data[p + 5 : pos])
        elif startswith(_DATA32, p, pos - 4) and unpack(data, p + 4)[0] + 8 == size:
            out.append(data[p + 8 : pos])
        else:
            out.append(bodies([memoryview(data)[p:pos]])[0])
    return out


def _bodies_numpy(pieces: Sequence[tuple[bytes, list[int]]]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    np = _np
    if len(pieces) == 1:
        big = pieces[0][0]
        pos = np.asarray(pieces[0][1], np.int64)
        starts, ends = pos[:-1], pos[1:]
    else:
        big = b"".join(d for d, _ in pieces)
        base = 0
        s_parts, e_parts = [], []
        for d, spans in pieces:
            pos = np.asarray(spans, np.int64) + base
            s_parts.append(pos[:-1])
            e_parts.append(pos[1:])
            base += len(d)
        starts, ends = np.concatenate(s_parts), np.concatenate(e_parts)
    m = len(starts)
    if not m:
        return binary_array([])
    u8 = np.frombuffer(big, np.uint8)
    last = len(u8) - 1
    size = ends - starts - 4
    ok = size >= 5
    head = starts + 4
    for k, byte in enumerate(_DATA8):
        ok &= u8[np.minimum(head + k, last)] == byte
    ok &= u8[np.minimum(head + 4, last)].astype(np.int64) + 5 == size
    if not ok.all():
        return None
    offsets = np.empty(2 * m, np.int64)
    offsets[0::2] = starts + 9
    offsets[1::2] = ends
    spread = pa.Array.from_buffers(
        pa.large_binary(), 2 * m - 1, [None, pa.py_buffer(offsets), pa.py_buffer(big)]
    )
    # The indices from buffers, not `pa.array(ndarray)`: pyarrow imports pandas on a `pa.array` call
    # when pandas is installed (0.6-0.7 s, once per process: every task process and Python worker).
    take = pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(np.arange(0, 2 * m, 2, dtype=np.int64))])
    return pc.take(spread, take).cast(pa.binary())


# --------------------------------------------------------------------------- writing


def compress(codec: int, data: bytes) -> bytes:
    """`data` compressed with a sub-entry compression code (`COMPRESSION_CODES`)."""
    if codec == 0:
        return data
    if codec == 1:
        import gzip

        return gzip.compress(data, compresslevel=6)
    import cramjam

    if codec == 2:
        return bytes(cramjam.snappy.compress(data))  # framing format, as the Java client writes
    if codec == 3:
        return bytes(cramjam.lz4.compress(data))  # LZ4 frame, as the Java client writes
    return bytes(cramjam.zstd.compress(data))


def sub_entry(messages: Sequence[bytes], codec: int) -> bytes:
    """One sub-entry batch of `messages` (everything after its publishing id in a publish frame)."""
    raw = b"".join(len(m).to_bytes(4, "big") + m for m in messages)
    data = compress(codec, raw)
    return SUB_ENTRY_HEADER.pack(0x80 | (codec << 4), len(messages), len(raw), len(data)) + data
