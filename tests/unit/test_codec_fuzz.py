"""Fuzzing the AMQP 1.0 decoder and the chunk reader with hypothesis.

Inputs are random bytes and valid messages mutated by bit flips, truncation, insertion, deletion
and planted type codes. The contracts (what the reader relies on):

- `codec.decode` raises ValueError and nothing else;
- `codec.bodies` never raises and returns one `bytes` per record;
- `chunk_entries.chunk_records` / `chunk_entries.chunk_bodies` never raise on well-framed chunks (whatever the
  messages hold) and raise only DataError on corrupt chunk framing;
- hostile chunks (sub-entries whose declared uncompressed size lies, decompression bombs, chunks
  cut short, chunks the connection flagged as corrupt) raise DataError, never return fewer or
  padded records, and never allocate much more than the declared size;
- `BatchBuilder(strict=False)` turns any well-framed chunk into a batch of the exact schema, one row
  per record; `strict=True` raises DataError naming the stream and the offset of the first message
  `decode` rejects, and builds the same batch when there is none.
"""

from __future__ import annotations

import functools
import gzip
import os
import struct
import tracemalloc
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import cramjam
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from rstream._pyamqp.message import Properties
from rstream.amqp import AMQPMessage

from pyspark_rmqs.broker import protocol
from pyspark_rmqs.core import chunks as chunk_entries
from pyspark_rmqs.core import codec
from pyspark_rmqs.core.batches import BatchBuilder
from pyspark_rmqs.core.errors import DataError
from pyspark_rmqs.core.schema import METADATA_FIELDS, source_arrow_schema

# 120 examples per property in `make test` (about a minute of CPU for the module on the suite's machine,
# where 300 took two); RMQS_FUZZ_EXAMPLES=2000 for a deeper search before a release.
FUZZ = settings(
    max_examples=int(os.environ.get("RMQS_FUZZ_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CHUNK_TS = 1_700_000_000_000
STREAM = "fuzz-stream"


def entry(m: bytes) -> bytes:
    return struct.pack(">I", len(m)) + m


COMPRESSORS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "none": (0, lambda d: d),
    "gzip": (1, gzip.compress),
    "snappy-raw": (2, lambda d: bytes(cramjam.snappy.compress_raw(d))),
    "snappy-framed": (2, lambda d: bytes(cramjam.snappy.compress(d))),
    "lz4-block": (3, lambda d: bytes(cramjam.lz4.compress_block(d, store_size=False))),
    "lz4-frame": (3, lambda d: bytes(cramjam.lz4.compress(d))),
    "zstd": (4, lambda d: bytes(cramjam.zstd.compress(d))),
}


def sub_entry(messages: list[bytes], compression: str) -> bytes:
    code, compress = COMPRESSORS[compression]
    raw = b"".join(entry(m) for m in messages)
    data = compress(raw)
    return struct.pack(">BHII", 0x80 | (code << 4), len(messages), len(raw), len(data)) + data


# --------------------------------------------------------------------------- valid messages


def _rs(**kwargs: Any) -> bytes:
    return bytes(AMQPMessage(**kwargs))


UID = uuid.UUID("12345678-1234-5678-1234-567812345678")
SAMPLES: list[bytes] = [
    codec.encode(b""),
    codec.encode(b"x" * 300),
    codec.encode(b"body", {"message_id": "m", "creation_time": 1_700_000_000_000, "group_sequence": 3}),
    codec.encode(b"b", None, {"routing_key": "rk", "n": 1}, {"x-opt": 2.5, "x-b": True}),
    _rs(
        body=b"rs",
        properties=Properties(message_id=UID, user_id=b"u", correlation_id=2**40, creation_time=5),
        application_properties={"k": "v", "big": 2**40, "none": None, "u": UID, "bin": b"\xff"},
        message_annotations={"x-a": 1},
    ),
    _rs(value="a string value"),
    _rs(value=b"binary value"),
    _rs(value=12345),
    b"\x00\x53\x75\xa0\x01a\x00\x53\x75\xa0\x01b",  # two data sections
    b"\x00\x53\x70\x45" + codec.encode(b"h"),  # empty header list, then data
    codec.encode(b"f") + b"\x00\x53\x78\xc1\x01\x00",  # data, then an empty footer map
    b"\x00\xa3\x10amqp:data:binary\xa0\x02hi",  # symbolic descriptor
    b"\x00\x80\x00\x00\x00\x00\x00\x00\x00\x75\xa0\x02hi",  # ulong descriptor
]

_props = st.fixed_dictionaries(
    {},
    optional={
        "message_id": st.text(max_size=20),
        "user_id": st.binary(max_size=8),
        "subject": st.text(max_size=20),
        "correlation_id": st.text(max_size=20),
        "content_type": st.text(max_size=10),
        "creation_time": st.integers(min_value=0, max_value=2**42),
        "absolute_expiry_time": st.integers(min_value=0, max_value=2**42),
        "group_sequence": st.integers(min_value=0, max_value=2**32 - 1),
        "group_id": st.text(max_size=10),
    },
)
_app_values = st.one_of(
    st.text(max_size=30), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.booleans(), st.none()
)
encoded = st.builds(
    codec.encode,
    st.binary(max_size=300),
    _props,
    st.dictionaries(st.text(max_size=10), _app_values, max_size=5),
    st.dictionaries(st.text(max_size=10), _app_values, max_size=5),
)
valid_messages = st.one_of(encoded, st.sampled_from(SAMPLES))

# Type codes worth planting: descriptors, section codes, fixed and variable widths, compounds.
CODES = [0x00, 0x40, 0x45, 0x53, 0x56, 0x70, 0x73, 0x75, 0x77, 0x80, 0x83, 0x98]
CODES += [0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0, 0xFF]


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A valid message (from `base`) after one to four random mutations."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "plant"]))
        if op == "truncate":
            data = data[: draw(st.integers(min_value=0, max_value=len(data)))]
        elif op == "insert":
            at = draw(st.integers(min_value=0, max_value=len(data)))
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif not data:
            continue
        elif op == "flip":
            at = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "delete":
            at = draw(st.integers(min_value=0, max_value=len(data) - 1))
            del data[at : at + draw(st.integers(min_value=1, max_value=8))]
        else:
            at = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[at] = draw(st.sampled_from(CODES))
    return bytes(data)


any_message = st.one_of(mutated(valid_messages), valid_messages, st.binary(max_size=200))


def decodes(m: bytes) -> bool:
    try:
        codec.decode(memoryview(m))
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- decode and bodies


# Lists of three bytes whose two elements run past their own end into the next list: decoded as
# written (before `codec._compound` checked that elements fit), each list holds the next two, a
# structure exponential in the length (26 lists: ~50 MB; 40: ~20 GB, the OOM kill CI once saw).
OVERLAPPING_LISTS = b"\x00\x53\x77" + b"\xc0\x01\x02" * 26 + b"\x40" * 20


def _decode_only_value_error(m: bytes) -> None:
    """`decode` raises nothing but ValueError, and allocates in proportion to the message (a small
    multiple of its bytes: a decoded value is never much larger than its encoding)."""
    d: Any = None

    def run() -> None:
        nonlocal d
        try:
            d = codec.decode(memoryview(m))
        except ValueError:
            d = None

    peak = peak_allocation(run)
    assert peak < (64 << 10) + 100 * len(m), f"decoding {len(m)} bytes allocated {peak} bytes"
    if d is None:
        return
    assert isinstance(d.body, bytes)
    assert d.properties is None or isinstance(d.properties, list)
    for section in (d.application_properties, d.message_annotations):
        assert section is None or isinstance(section, dict)


@FUZZ
@given(st.binary(max_size=400))
@example(b"\x00\x53\x77\xc1\x03\x02\x45\x40")  # amqp-value: a map whose key is a list
@example(b"\x00\x53\x74\xc1\x03\x02\x40\x40")  # application-properties with a null key
@example(b"\x00\x53\x72\xc1\x09\x02\xa3\x01k\x73\x00\x00\xd8\x00")  # char: a lone surrogate
@example(b"\x00\x53\x72\xc1\x09\x02\xa3\x01k\x73\xff\xff\xff\xff")  # char: beyond Unicode
@example(OVERLAPPING_LISTS)
def test_decode_random_bytes_raises_only_value_error(raw: bytes) -> None:
    _decode_only_value_error(raw)


@FUZZ
@given(mutated(valid_messages))
def test_decode_mutated_messages_raises_only_value_error(m: bytes) -> None:
    _decode_only_value_error(m)


def test_decode_valid_samples() -> None:
    for m in SAMPLES:
        assert decodes(m), m


@FUZZ
@given(st.lists(any_message, max_size=8))
@example([b"\x00\x53\x77\xc1\x03\x02\x45\x40"])
@example([OVERLAPPING_LISTS])
def test_bodies_never_raises(records: list[bytes]) -> None:
    out = codec.bodies([memoryview(r) for r in records])
    assert len(out) == len(records)
    assert all(isinstance(body, bytes) for body in out)
    for raw, body in zip(records, out, strict=True):
        if decodes(raw):  # a valid message: the body `decode` finds
            assert body == codec.decode(memoryview(raw)).body


# --------------------------------------------------------------------------- chunks


@st.composite
def chunks(
    draw: st.DrawFn, messages: st.SearchStrategy[bytes] = any_message
) -> tuple[bytes, int, list[bytes]]:
    """(chunk data, number of entries, the messages in offset order): simple entries and sub-entry batches."""
    parts: list[bytes] = []
    records: list[bytes] = []
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        if draw(st.booleans()):
            m = draw(messages)
            parts.append(entry(m))
            records.append(m)
        else:
            batch = draw(st.lists(messages, min_size=1, max_size=4))
            parts.append(sub_entry(batch, draw(st.sampled_from(list(COMPRESSORS)))))
            records.extend(batch)
    return b"".join(parts), len(parts), records


@FUZZ
@given(chunks(), st.data())
def test_well_framed_chunks_never_raise(chunk: tuple[bytes, int, list[bytes]], data: st.DataObject) -> None:
    raw, entries, records = chunk
    assert [bytes(r) for r in chunk_entries.chunk_records(raw, entries)] == records
    skip = data.draw(st.integers(min_value=0, max_value=len(records)))
    take = data.draw(st.integers(min_value=0, max_value=len(records) - skip))
    want = codec.bodies([memoryview(m) for m in records[skip : skip + take]])
    assert chunk_entries.chunk_bodies(raw, entries, skip, take) == want


@st.composite
def corrupt_chunks(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """(mutated chunk data, the original number of entries and of records)."""
    raw, entries, records = draw(chunks(valid_messages))
    return draw(mutated(st.just(raw))), entries, len(records)


@FUZZ
@given(corrupt_chunks(), st.data())
@example((b"\x00\x00\x00\x0a\x00\x53\x75\xa0", 1, 1), None)  # a record cut right after its section header
@example((struct.pack(">BHII", 0xB0, 1, 2**32 - 1, 3) + b"\x10ab", 1, 1), None)  # lz4 claiming 4 GiB
@example((struct.pack(">BHII", 0xC0, 1, 2**32 - 1, 6) + b"\x28\xb5\x2f\xfd\x00\x00", 1, 1), None)  # zstd
@example((struct.pack(">BHII", 0xA0, 1, 9, 6) + b"\xff\xff\xff\xff\x0f\x00", 1, 1), None)  # snappy raw
def test_corrupt_chunks_raise_only_data_error(
    chunk: tuple[bytes, int, int], data: st.DataObject | None
) -> None:
    raw, entries, n = chunk
    try:
        chunk_entries.chunk_records(raw, entries)
    except DataError:
        pass
    skip, take = 0, n
    if data is not None:
        skip = data.draw(st.integers(min_value=0, max_value=n))
        take = data.draw(st.integers(min_value=0, max_value=n - skip))
    try:
        out = chunk_entries.chunk_bodies(raw, entries, skip, take)
    except DataError:
        return
    assert all(isinstance(b, bytes) for b in out)


@pytest.mark.parametrize(
    ("kind", "payload"),
    [(0xB0, b"\x10ab"), (0xA0, b"\xff\xff\xff\xff\x0f\x00")],
    ids=["lz4-block", "snappy-raw"],
)
def test_sub_entry_claiming_an_impossible_size_is_refused_before_allocating(
    kind: int, payload: bytes
) -> None:
    """A failed allocation in the decompressor aborts the process (e.g. under PySpark's memory limit)."""
    raw = struct.pack(">BHII", kind, 1, 2**32 - 1, len(payload)) + payload
    with pytest.raises(DataError, match="claims 4294967295 uncompressed bytes"):
        chunk_entries.chunk_records(raw, 1)


def test_corrupt_chunk_in_batch_builder_names_stream_and_offset() -> None:
    raw = entry(codec.encode(b"a")) + b"\x00\x00"  # the second entry's size is cut
    for fields in ((), METADATA_FIELDS):
        b = BatchBuilder(STREAM, fields)
        with pytest.raises(DataError, match=r"chunk at offset 100 of stream 'fuzz-stream': corrupt chunk"):
            b.add_chunk(raw, 2, 0, 2, 100, CHUNK_TS)
        assert b.flush() is None  # nothing half-added
    fewer = entry(codec.encode(b"a")) + sub_entry([codec.encode(b"b")], "gzip")  # 2 records, 3 announced
    for fields in ((), METADATA_FIELDS):
        with pytest.raises(DataError, match="it holds 2 of the 3 records asked for"):
            BatchBuilder(STREAM, fields).add_chunk(fewer, 2, 0, 3, 7, CHUNK_TS)


# --------------------------------------------------------------------------- hostile chunks

COMPRESSED = [name for name in COMPRESSORS if name != "none"]


def sub_entry_declaring(messages: list[bytes], compression: str, declared: int) -> bytes:
    """A sub-entry batch whose header declares `declared` uncompressed bytes, true or not."""
    code, compress = COMPRESSORS[compression]
    data = compress(b"".join(entry(m) for m in messages))
    return struct.pack(">BHII", 0x80 | (code << 4), len(messages), declared, len(data)) + data


def assert_rejected(raw: bytes, entries: int, records: int, match: str | None = None) -> None:
    """Every way of reading the chunk raises DataError; the BatchBuilder names stream and offset."""
    with pytest.raises(DataError, match=match):
        chunk_entries.chunk_records(raw, entries)
    with pytest.raises(DataError, match=match):
        chunk_entries.chunk_bodies(raw, entries, 0, records)
    for fields in ((), METADATA_FIELDS):
        for strict in (False, True):  # a corrupt chunk fails lenient reads too: never a shorter batch
            b = BatchBuilder(STREAM, fields, strict=strict)
            where = rf"chunk at offset 500 of stream '{STREAM}': .*{match or ''}"
            with pytest.raises(DataError, match=where):
                b.add_chunk(raw, entries, 0, records, 500, CHUNK_TS)
            assert b.flush() is None


_deltas = st.one_of(
    st.integers(min_value=-64, max_value=64), st.integers(min_value=-(2**32), max_value=2**32)
)


@FUZZ
@given(
    st.lists(valid_messages, min_size=1, max_size=4),
    st.sampled_from(list(COMPRESSORS)),
    _deltas,
    st.booleans(),
)
@example([codec.encode(b"x" * 8192)], "gzip", -8000, False)  # 8 KiB declared as 192 bytes
def test_sub_entry_declaring_a_wrong_uncompressed_size_is_rejected(
    messages: list[bytes], compression: str, delta: int, entry_first: bool
) -> None:
    actual = sum(4 + len(m) for m in messages)
    declared = min(max(actual + delta, 0), 2**32 - 1)
    assume(declared != actual)
    batch = sub_entry_declaring(messages, compression, declared)
    raw = entry(codec.encode(b"first")) + batch if entry_first else batch
    assert_rejected(raw, 1 + entry_first, len(messages) + entry_first, "sub-entry")


BOMB_BYTES = 32 << 20  # what the bomb expands to; its header declares 8 KiB


@functools.cache
def bomb(compression: str) -> bytes:
    """A one-message sub-entry of BOMB_BYTES zeros, declaring 8 KiB uncompressed."""
    return sub_entry_declaring([b"\0" * (BOMB_BYTES - 4)], compression, 8 << 10)


def peak_allocation(fn: Callable[[], object]) -> int:
    """Peak bytes Python allocated while `fn` ran (decompressed output always lands in Python memory)."""
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("compression", COMPRESSED)
def test_decompression_bomb_is_refused_without_expanding(compression: str) -> None:
    raw = bomb(compression)

    def read() -> None:
        with pytest.raises(DataError, match="sub-entry"):
            chunk_entries.chunk_records(raw, 1)

    peak = peak_allocation(read)
    assert peak < 2 * len(raw) + (1 << 20), f"{peak} bytes allocated for an 8 KiB sub-entry"


@pytest.mark.parametrize("compression", COMPRESSED)
def test_honest_sub_entry_above_the_chunk_ceiling_is_refused_before_decompressing(
    compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunk_entries, "MAX_CHUNK_UNCOMPRESSED_BYTES", 1 << 20)
    raw = sub_entry_declaring([b"\0" * (BOMB_BYTES - 4)], compression, BOMB_BYTES)

    def read() -> None:
        with pytest.raises(DataError, match=f"claims {BOMB_BYTES} uncompressed bytes, more than the 1048576"):
            chunk_entries.chunk_records(raw, 1)

    assert peak_allocation(read) < 2 * len(raw) + (1 << 20)


def test_chunk_ceiling_counts_all_sub_entries_together(monkeypatch: pytest.MonkeyPatch) -> None:
    message = codec.encode(b"x" * 1000)
    batch = sub_entry([message], "zstd")
    monkeypatch.setattr(chunk_entries, "MAX_CHUNK_UNCOMPRESSED_BYTES", 2 * (4 + len(message)))
    assert [bytes(r) for r in chunk_entries.chunk_records(batch + batch, 2)] == [message, message]
    assert_rejected(batch + batch + batch, 3, 3, "sub-entry 2 claims")


@FUZZ
@given(chunks(valid_messages), st.data())
@example((entry(b"\x00\x53\x75\xa0\x01a") + entry(b"\x00\x53\x75\xa0\x01b"), 2, [b""] * 2), None)
def test_truncated_chunks_are_rejected_not_shortened(
    chunk: tuple[bytes, int, list[bytes]], data: st.DataObject | None
) -> None:
    raw, entries, records = chunk
    cut = len(raw) - 1 if data is None else data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    assert_rejected(raw[:cut], entries, len(records))


@pytest.mark.parametrize("compression", list(COMPRESSORS))
def test_sub_entry_whose_messages_overrun_the_batch_is_rejected(compression: str) -> None:
    code, compress = COMPRESSORS[compression]
    inner = struct.pack(">I", 100) + b"short"  # a message declaring 100 bytes, 5 present
    data = compress(inner)
    raw = struct.pack(">BHII", 0x80 | (code << 4), 1, len(inner), len(data)) + data
    assert_rejected(raw, 1, 1, "message 0 needs 100 bytes")
    extra = entry(b"m") + b"xyz"  # three bytes after the batch's one message
    data = compress(extra)
    raw = struct.pack(">BHII", 0x80 | (code << 4), 1, len(extra), len(data)) + data
    assert_rejected(raw, 1, 1, "3 bytes are left after its 1 messages")


# --------------------------------------------------------------------------- chunks flagged by the connection


def deliver_frame(chunk_data: bytes, *, crc: int, size: int | None = None) -> bytearray:
    """A Deliver frame (key, version, then the osiris chunk header) of one chunk at offset 500."""
    header = protocol._DELIVER.pack(
        7, 0x50, 0, 2, 2, CHUNK_TS, 0, 500, crc, len(chunk_data) if size is None else size, 0, 0
    )
    return bytearray(struct.pack(">HH", protocol.DELIVER_KEY, 1) + header + chunk_data)


def test_chunk_failing_its_crc_or_cut_short_fails_the_read_naming_stream_and_offset() -> None:
    raw = entry(codec.encode(b"a")) + entry(codec.encode(b"b"))
    flipped = raw[:-1] + bytes([raw[-1] ^ 1])
    conn = protocol.FrameConnection("localhost", 5552)
    got: list[protocol.Chunk] = []
    conn.deliver = got.append
    for frame in (
        deliver_frame(raw, crc=zlib.crc32(raw)),
        deliver_frame(flipped, crc=zlib.crc32(raw)),
        deliver_frame(raw[:-3], crc=zlib.crc32(raw), size=len(raw)),
    ):
        conn._on_deliver(frame)  # never raises: that would end the connection's listener
    good, corrupt, short = got
    assert (good.first_offset, good.num_records, good.subscription_id) == (500, 2, 7)
    assert [bytes(r) for r in chunk_entries.chunk_records(good.data, 2)] == [
        codec.encode(b"a"),
        codec.encode(b"b"),
    ]
    assert_rejected(corrupt.data, 2, 2, "CRC-32 mismatch")
    assert_rejected(short.data, 2, 2, "the frame holds 17 of the chunk's 20 data bytes")


# --------------------------------------------------------------------------- BatchBuilder


field_sets = st.sampled_from(
    [(), METADATA_FIELDS, ("properties",), ("application_properties", "routing_key")]
)


@FUZZ
@given(chunks(), field_sets, st.integers(min_value=0, max_value=2**40), st.data())
def test_batch_builder_lenient_never_raises(
    chunk: tuple[bytes, int, list[bytes]], fields: tuple[str, ...], first: int, data: st.DataObject
) -> None:
    raw, entries, records = chunk
    skip = data.draw(st.integers(min_value=0, max_value=len(records)))
    take = data.draw(st.integers(min_value=0, max_value=len(records) - skip))
    b = BatchBuilder(STREAM, fields, strict=False)
    b.add_chunk(raw, entries, skip, take, first, CHUNK_TS)
    batch = b.flush()
    if take == 0:
        assert batch is None
        return
    assert batch is not None
    assert batch.schema == source_arrow_schema(fields)
    assert batch.num_rows == take
    assert batch.column("offset").to_pylist() == list(range(first, first + take))
    taken = records[skip : skip + take]
    values = batch.column("value").to_pylist()
    if fields:  # full decoding: a message decode rejects is read as its raw bytes
        for m, v in zip(taken, values, strict=True):
            assert v == (codec.decode(memoryview(m)).body if decodes(m) else m)
    else:
        assert values == codec.bodies([memoryview(m) for m in taken])


@FUZZ
@given(chunks(), st.integers(min_value=0, max_value=2**40))
def test_batch_builder_strict_names_the_first_bad_offset(
    chunk: tuple[bytes, int, list[bytes]], first: int
) -> None:
    raw, entries, records = chunk
    b = BatchBuilder(STREAM, METADATA_FIELDS, strict=True)
    b.add_chunk(raw, entries, 0, len(records), first, CHUNK_TS)
    bad = [i for i, m in enumerate(records) if not decodes(m)]
    if not bad:
        batch = b.flush()
        assert batch is not None and batch.num_rows == len(records)
        return
    with pytest.raises(DataError) as info:
        b.flush()
    msg = str(info.value)
    assert f"offset {first + bad[0]} " in msg
    assert f"'{STREAM}'" in msg


def test_strict_and_lenient_agree_on_a_known_bad_message() -> None:
    good, bad = codec.encode(b"ok", {"message_id": "m"}), b"\x00\x53\x77\xc1\x03\x02\x45\x40"
    raw = entry(good) + entry(bad) + entry(good)
    lenient = BatchBuilder(STREAM, METADATA_FIELDS)
    lenient.add_chunk(raw, 3, 0, 3, 40, CHUNK_TS)
    batch = lenient.flush()
    assert batch is not None
    assert batch.column("value").to_pylist() == [b"ok", bad, b"ok"]
    assert batch.column("properties").is_null().to_pylist() == [False, True, False]
    strict = BatchBuilder(STREAM, METADATA_FIELDS, strict=True)
    strict.add_chunk(raw, 3, 0, 3, 40, CHUNK_TS)
    with pytest.raises(DataError, match=r"offset 41 of stream 'fuzz-stream'"):
        strict.flush()
