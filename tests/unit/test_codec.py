"""Unit and property tests of `codec` (AMQP 1.0), `chunks` (chunk entries) and `batches.BatchBuilder`.

rstream's own AMQP encoder and decoder are the independent reference: what we encode must decode
there, and what rstream encodes (as other clients would publish it) must decode here.
"""

from __future__ import annotations

import gzip
import struct
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import cramjam
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rstream._pyamqp.message import Header, Properties
from rstream.amqp import AMQPMessage, amqp_decoder

from pyspark_rmqs.core import codec
from pyspark_rmqs.core.batches import BatchBuilder
from pyspark_rmqs.core.chunks import chunk_bodies, chunk_records
from pyspark_rmqs.core.codec import Timestamp, bodies, decode, encode, to_text
from pyspark_rmqs.core.errors import DataError
from pyspark_rmqs.core.schema import METADATA_FIELDS, PROPERTY_NAMES, TS, source_arrow_schema

T0 = 1_700_000_000_123  # 2023-11-14T22:13:20.123Z in epoch millis
T0_DT = datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
EXPIRY = 1_700_000_099_000
EXPIRY_DT = datetime(2023, 11, 14, 22, 14, 59, tzinfo=UTC)
UID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def rs(**kwargs: Any) -> bytes:
    """A message as rstream's AMQP encoder writes it."""
    return bytes(AMQPMessage(**kwargs))


def mv(b: bytes) -> memoryview:
    return memoryview(b)


def entry(m: bytes) -> bytes:
    """A simple chunk entry: uint32 size + message."""
    return struct.pack(">I", len(m)) + m


COMPRESSORS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "none": (0, lambda d: d),
    "gzip": (1, lambda d: gzip.compress(d)),
    "snappy-raw": (2, lambda d: bytes(cramjam.snappy.compress_raw(d))),
    "snappy-framed": (2, lambda d: bytes(cramjam.snappy.compress(d))),
    "lz4-block": (3, lambda d: bytes(cramjam.lz4.compress_block(d, store_size=False))),
    "lz4-frame": (3, lambda d: bytes(cramjam.lz4.compress(d))),
    "zstd": (4, lambda d: bytes(cramjam.zstd.compress(d))),
}


def sub_entry(messages: list[bytes], compression: str = "none") -> bytes:
    """A sub-entry batch: 0x80 | codec << 4, uint16 records, uint32 uncompressed, uint32 size, data."""
    code, compress = COMPRESSORS[compression]
    raw = b"".join(entry(m) for m in messages)
    data = compress(raw)
    return struct.pack(">BHII", 0x80 | (code << 4), len(messages), len(raw), len(data)) + data


def data_section(body: bytes) -> bytes:
    if len(body) < 256:
        return b"\x00\x53\x75\xa0" + bytes([len(body)]) + body
    return b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body


# =========================================================================== encode -> rstream


def test_encode_body_only_is_one_data_section() -> None:
    assert encode(b"hello") == b"\x00\x53\x75\xa0\x05hello"
    assert encode(b"") == b"\x00\x53\x75\xa0\x00"
    assert amqp_decoder(encode(b"hello")).body == b"hello"


def test_encode_large_body_uses_vbin32() -> None:
    body = bytes(range(256)) * 2
    m = encode(body)
    assert m[:8] == b"\x00\x53\x75\xb0" + struct.pack(">I", 512)
    assert amqp_decoder(m).body == body


def test_encode_all_properties_decoded_by_rstream() -> None:
    props = {
        "message_id": "m-1",
        "user_id": b"guest",
        "to": "/queues/q",
        "subject": "subj",
        "reply_to": "/queues/r",
        "correlation_id": "c-1",
        "content_type": "application/json",
        "content_encoding": "gzip",
        "absolute_expiry_time": EXPIRY_DT,
        "creation_time": T0,
        "group_id": "g",
        "group_sequence": 42,
        "reply_to_group_id": "rg",
    }
    d = amqp_decoder(encode(b"body", props))
    assert d.body == b"body"
    assert d.properties == Properties(
        message_id=b"m-1",
        user_id=b"guest",
        to=b"/queues/q",
        subject=b"subj",
        reply_to=b"/queues/r",
        correlation_id=b"c-1",
        content_type=b"application/json",
        content_encoding=b"gzip",
        absolute_expiry_time=EXPIRY,
        creation_time=T0,
        group_id=b"g",
        group_sequence=42,
        reply_to_group_id=b"rg",
    )
    assert d.application_properties is None
    assert d.message_annotations is None


def test_encode_creation_time_from_datetimes() -> None:
    aware = amqp_decoder(encode(b"", {"creation_time": T0_DT})).properties
    naive = amqp_decoder(encode(b"", {"creation_time": T0_DT.replace(tzinfo=None)})).properties
    plus2 = T0_DT.astimezone(timezone(timedelta(hours=2)))
    offset = amqp_decoder(encode(b"", {"creation_time": plus2})).properties
    assert aware.creation_time == naive.creation_time == offset.creation_time == T0


def test_to_millis_is_exact() -> None:
    # float timestamp() * 1000 gives ...352 for this instant
    ms = 1_096_689_805_353
    dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert codec.to_millis(dt) == ms
    assert codec.to_millis(datetime(1969, 12, 31, 23, 59, 59, 999000)) == -1
    assert codec.to_millis(T0) == T0


@given(st.integers(min_value=-(10**13), max_value=10**14))
def test_to_millis_round_trips_any_millisecond(ms: int) -> None:
    dt = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert codec.to_millis(dt) == ms
    assert codec.to_millis(dt.replace(tzinfo=None)) == ms


def test_encode_properties_trailing_nulls_trimmed_and_all_null_omitted() -> None:
    m = encode(b"x", {"message_id": "a"})
    # properties: described list8 with a single string field
    assert m == b"\x00\x53\x73\xc0\x04\x01\xa1\x01a" + b"\x00\x53\x75\xa0\x01x"
    assert amqp_decoder(m).properties == Properties(message_id=b"a")
    assert encode(b"x", {"message_id": None, "subject": None}) == encode(b"x")
    assert encode(b"x", {}, {}, {}) == encode(b"x")


def test_encode_group_sequence_is_uint32() -> None:
    for n in (0, 7, 2**32 - 1):
        assert amqp_decoder(encode(b"", {"group_sequence": n})).properties.group_sequence == n


@pytest.mark.parametrize("n", [-1, 2**32, 2**63 - 1, -(2**63)])
def test_encode_group_sequence_outside_uint32_fails_instead_of_wrapping(n: int) -> None:
    with pytest.raises(
        DataError, match=rf"'properties.group_sequence' must be between 0 and 4294967295.*got {n}$"
    ):
        encode(b"", {"group_sequence": n})


def test_encode_maps_decoded_by_rstream() -> None:
    app = {"a": "b", "n": 5, "neg": -(2**40), "t": True, "f": False, "x": 1.5, "none": None, "bin": b"\x01"}
    ann = {"x-opt-k": "v", "x-n": 7}
    d = amqp_decoder(encode(b"payload", None, app, ann))
    assert d.body == b"payload"
    assert d.application_properties == {
        b"a": b"b",
        b"n": 5,
        b"neg": -(2**40),
        b"t": True,
        b"f": False,
        b"x": 1.5,
        b"none": None,
        b"bin": b"\x01",
    }
    assert d.message_annotations == {b"x-opt-k": b"v", b"x-n": 7}
    assert d.properties is None


def test_encode_datetime_application_property_is_a_timestamp() -> None:
    m = encode(b"", None, {"ts": T0_DT})
    assert amqp_decoder(m).application_properties == {b"ts": T0}
    assert decode(mv(m)).application_properties == {"ts": T0}
    assert isinstance(decode(mv(m)).application_properties["ts"], Timestamp)  # type: ignore[index]


def test_encode_large_strings_and_maps_use_32_bit_forms() -> None:
    long = "é" * 200  # 400 bytes of UTF-8: str32
    app = {f"k{i:03d}": f"v{i}" for i in range(100)}  # map32 (> 255 bytes)
    app["long"] = long
    props = {"subject": long, "message_id": "m", "creation_time": T0}  # list32
    m = encode(b"b" * 300, props, app, {"x-long": long})
    assert b"\xb1\x00\x00\x01\x90" + long.encode() in m
    assert b"\x00\x53\x73\xd0" in m
    assert b"\x00\x53\x74\xd1" in m
    d = amqp_decoder(m)
    assert d.body == b"b" * 300
    assert d.properties == Properties(message_id=b"m", subject=long.encode(), creation_time=T0)
    assert d.application_properties == {k.encode(): v.encode() for k, v in app.items()}
    assert d.message_annotations == {b"x-long": long.encode()}
    # and back through our own decoder
    ours = decode(mv(m))
    assert ours.body == b"b" * 300
    assert ours.application_properties == app
    assert ours.message_annotations == {"x-long": long}
    assert ours.properties == ["m", None, None, long, None, None, None, None, None, T0]


# =========================================================================== rstream -> decode / bodies


def test_decode_full_rstream_message() -> None:
    body = bytes(range(256)) + b"tail"  # 260 bytes: vbin32
    long = "s" * 300  # str32
    m = rs(
        body=body,
        properties=Properties(
            message_id=UID,
            user_id=b"u",
            to="t",
            subject=long,
            reply_to="rt",
            correlation_id=12_345_678_901_234,  # ulong
            content_type="text/plain",
            content_encoding="utf-8",
            absolute_expiry_time=EXPIRY,
            creation_time=T0,
            group_id="g",
            group_sequence=3,
            reply_to_group_id="rg",
        ),
        application_properties={
            "k": "v" * 300,
            "n": 5,
            "big": 2**40,
            "f": 1.5,
            "b": False,
            "u": UID,
            "bin": b"\xff",
            "none": None,
        },
        message_annotations={"x-a": 1, "x-s": "str"},
    )
    d = decode(mv(m))
    assert d.body == body
    assert d.properties == [
        UID,
        b"u",
        "t",
        long,
        "rt",
        12_345_678_901_234,
        "text/plain",
        "utf-8",
        EXPIRY,
        T0,
        "g",
        3,
        "rg",
    ]
    assert d.properties is not None
    assert isinstance(d.properties[8], Timestamp)
    assert isinstance(d.properties[9], Timestamp)
    assert d.application_properties == {
        "k": "v" * 300,
        "n": 5,
        "big": 2**40,
        "f": 1.5,
        "b": False,
        "u": UID,
        "bin": b"\xff",
        "none": None,
    }
    assert d.message_annotations == {"x-a": 1, "x-s": "str"}
    assert bodies([mv(m)]) == [body]


@pytest.mark.parametrize(
    ("message_id", "expected", "text"),
    [
        ("plain", "plain", "plain"),
        (UID, UID, "12345678-1234-5678-1234-567812345678"),
        (2**64 - 1, 2**64 - 1, "18446744073709551615"),
        (7, 7, "7"),
        (b"\xff\xfe", b"\xff\xfe", "fffe"),
        (b"ok", b"ok", "ok"),
    ],
)
def test_decode_message_id_types(message_id: Any, expected: Any, text: str) -> None:
    m = rs(body=b"x", properties=Properties(message_id=message_id, correlation_id=message_id))
    d = decode(mv(m))
    assert d.properties is not None
    assert d.properties[0] == expected
    assert d.properties[5] == expected
    assert type(d.properties[0]) is type(expected)
    assert to_text(d.properties[0]) == text


def test_decode_skips_header_delivery_annotations_and_footer() -> None:
    m = rs(
        body=b"x",
        header=Header(durable=True, priority=5),
        delivery_annotations={"x-d": 1},
        footer={"f": "v"},
        properties=Properties(subject="s"),
    )
    d = decode(mv(m))
    assert d.body == b"x"
    assert d.properties == [None, None, None, "s", *[None] * 9]  # rstream writes all 13 fields
    assert d.application_properties is None
    assert d.message_annotations is None
    assert bodies([mv(m)]) == [b"x"]


@pytest.mark.parametrize(
    ("value", "body"),
    [("text", b"text"), ("é" * 300, ("é" * 300).encode()), (b"bin", b"bin"), (b"\x00" * 300, b"\x00" * 300)],
)
def test_amqp_value_bodies(value: Any, body: bytes) -> None:
    m = rs(value=value)
    assert m[:3] == b"\x00\x53\x77"
    assert decode(mv(m)).body == body
    assert bodies([mv(m)]) == [body]


def test_amqp_value_of_other_types_is_its_text() -> None:
    m = rs(value=42)
    assert decode(mv(m)).body == b"42"
    assert bodies([mv(m)]) == [b"42"]
    null = b"\x00\x53\x77\x40"
    assert decode(mv(null)).body == b""
    assert bodies([mv(null)]) == [b""]


def test_multiple_data_sections_are_joined() -> None:
    m = data_section(b"ab") + data_section(b"c" * 300) + data_section(b"")
    assert decode(mv(m)).body == b"ab" + b"c" * 300
    assert bodies([mv(m)]) == [b"ab" + b"c" * 300]
    with_props = encode(b"", {"subject": "s"})[:-5] + data_section(b"1") + data_section(b"2")
    d = decode(mv(with_props))
    assert d.body == b"12"
    assert d.properties == [None, None, None, "s"]


def test_other_descriptor_encodings() -> None:
    ulong = b"\x00\x80" + struct.pack(">Q", 0x75) + b"\xa0\x01z"
    symbolic = b"\x00\xa3\x10amqp:data:binary\xa0\x01y"
    sym_props = b"\x00\xa3\x14amqp:properties:list\xc0\x04\x01\xa1\x01i"
    assert decode(mv(ulong)).body == b"z"
    assert decode(mv(symbolic)).body == b"y"
    assert bodies([mv(ulong), mv(symbolic)]) == [b"z", b"y"]
    d = decode(mv(sym_props + ulong))
    assert d.body == b"z"
    assert d.properties == ["i"]


def test_decode_value_types() -> None:
    pairs = (
        b"\xa1\x01a\x43"  # uint0
        + b"\xa1\x01b\x44"  # ulong0
        + b"\xa1\x01c\x51\xff"  # byte -1
        + b"\xa1\x01d\x61\xff\xfe"  # short -2
        + b"\xa1\x01e\x71\xff\xff\xff\xfd"  # int -3
        + b"\xa1\x01f\x56\x01"  # boolean true
        + b"\xa1\x01g\x73\x00\x00\x00\x41"  # char 'A'
        + b"\xa1\x01h\xc0\x03\x02\x41\x42"  # list [True, False]
    )
    # application-properties: map8 of 8 pairs (size counts the count byte)
    m = b"\x00\x53\x74\xc1" + bytes([len(pairs) + 1, 16]) + pairs + data_section(b"v")
    d = decode(mv(m))
    assert d.application_properties == {
        "a": 0,
        "b": 0,
        "c": -1,
        "d": -2,
        "e": -3,
        "f": True,
        "g": "A",
        "h": [True, False],
    }


# =========================================================================== non-AMQP input

NOT_AMQP = [
    b"garbage",
    b"\x00",
    b"\x00\x53",
    b"\x00\x53\x75\xb0\x00\x00",  # truncated vbin32 length
    b"\x00\x53\x75\xa0\x05ab",  # truncated vbin8
    b"\x00\x53\x77\xa1\x02\xff\xfe",  # amqp-value string that is not UTF-8
    b"\x00\x53\x70" + b"\x00" * 5000,  # absurdly nested descriptors
    b"\x00\x99\x75",  # unsupported descriptor
    b"\x00\x53\x75\xa0\x01ab",  # a data section, then a stray byte
    b"\xff" * 20,
]


@pytest.mark.parametrize("raw", NOT_AMQP, ids=range(len(NOT_AMQP)))
def test_bodies_returns_raw_bytes_for_non_amqp(raw: bytes) -> None:
    assert bodies([mv(raw)]) == [raw]
    with pytest.raises(ValueError):
        decode(mv(raw))


def test_bodies_empty_record() -> None:
    assert bodies([mv(b"")]) == [b""]
    assert decode(mv(b"")).body == b""


@given(st.binary(max_size=200))
def test_bodies_never_raises(raw: bytes) -> None:
    out = bodies([mv(raw)])
    assert len(out) == 1
    assert isinstance(out[0], bytes)
    try:
        decode(mv(raw))
    except ValueError:
        pass


def test_truncated_messages_yield_raw_bytes() -> None:
    ann = encode(b"", None, None, {"x-a": "b"})[:-5]
    props = encode(b"", {"message_id": "m", "creation_time": T0})[:-5]
    app = encode(b"", None, {"k": "v"})[:-5]
    m = encode(b"body" * 20, {"message_id": "m", "creation_time": T0}, {"k": "v"}, {"x-a": "b"})
    assert m == ann + props + app + data_section(b"body" * 20)
    boundaries = {0, len(ann), len(ann) + len(props), len(ann) + len(props) + len(app)}
    for cut in range(len(m)):
        part = m[:cut]
        if cut in boundaries:  # whole sections: a valid message without a body
            assert decode(mv(part)).body == b""
            assert bodies([mv(part)]) == [b""]
        else:
            assert bodies([mv(part)]) == [part]
            with pytest.raises(ValueError):
                decode(mv(part))


# =========================================================================== chunks


MESSAGES = [
    encode(b"a"),
    encode(b"b" * 300, {"subject": "s"}, {"k": "v"}),
    rs(value="v"),
    b"junk",
    data_section(b"d") + b"\x00\x53\x78\xc1\x01\x00",  # a data section and an empty footer
]
BODIES = [b"a", b"b" * 300, b"v", b"junk", b"d"]


def test_chunk_records_simple_entries() -> None:
    chunk = b"".join(entry(m) for m in MESSAGES)
    records = chunk_records(chunk, len(MESSAGES))
    assert [bytes(r) for r in records] == MESSAGES
    assert all(isinstance(r, memoryview) for r in records)
    assert chunk_records(memoryview(chunk), len(MESSAGES)) == records


def test_chunk_bodies_simple_entries() -> None:
    chunk = b"".join(entry(m) for m in MESSAGES)
    n = len(MESSAGES)
    assert chunk_bodies(chunk, n, 0, n) == BODIES
    assert chunk_bodies(chunk, n, 1, 2) == BODIES[1:3]
    assert chunk_bodies(chunk, n, 3, 2) == BODIES[3:5]
    assert chunk_bodies(chunk, n, 4, 1) == BODIES[4:]
    assert chunk_bodies(chunk, n, 2, 0) == []


def test_chunk_bodies_truncated_record_at_chunk_end() -> None:
    for tail in (b"\x00\x53\x75\xa0", b"\x00\x53\x75\xb0\x00\x00", b"\x00\x53\x75"):
        chunk = entry(encode(b"ok")) + entry(tail)
        assert chunk_bodies(chunk, 2, 0, 2) == [b"ok", tail]
        assert bodies(chunk_records(chunk, 2)) == [b"ok", tail]


@pytest.mark.parametrize("compression", list(COMPRESSORS))
def test_sub_entry_batches(compression: str) -> None:
    m = [encode(f"m{i}".encode() * (i + 1)) for i in range(6)]
    chunk = entry(m[0]) + sub_entry(m[1:4], compression) + entry(m[4]) + sub_entry(m[5:], compression)
    entries = 4
    assert [bytes(r) for r in chunk_records(chunk, entries)] == m
    want = [f"m{i}".encode() * (i + 1) for i in range(6)]
    assert chunk_bodies(chunk, entries, 0, 6) == want
    assert chunk_bodies(chunk, entries, 2, 1) == want[2:3]  # inside the batch
    assert chunk_bodies(chunk, entries, 2, 3) == want[2:5]  # out of the batch into an entry
    assert chunk_bodies(chunk, entries, 0, 2) == want[0:2]  # from an entry into the batch
    assert chunk_bodies(chunk, entries, 4, 2) == want[4:6]  # into the last batch


def test_sub_entry_batch_first_in_chunk() -> None:
    m = [encode(b"x" * 500), rs(value=b"y"), b"raw"]
    chunk = sub_entry(m, "gzip") + entry(encode(b"z"))
    assert chunk_bodies(chunk, 2, 1, 3) == [b"y", b"raw", b"z"]


def test_sub_entry_unknown_compression() -> None:
    raw = entry(encode(b"a"))
    chunk = struct.pack(">BHII", 0x80 | (5 << 4), 1, len(raw), len(raw)) + raw
    with pytest.raises(DataError, match="compression code 5"):
        chunk_records(chunk, 1)


# =========================================================================== to_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, None),
        ("s", "s"),
        ("", ""),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-7, "-7"),
        (2**64 - 1, "18446744073709551615"),
        (T0, "1700000000123"),  # a plain int is not a timestamp
        (1.5, "1.5"),
        (Timestamp(T0), "2023-11-14T22:13:20.123Z"),
        (Timestamp(0), "1970-01-01T00:00:00.000Z"),
        (Timestamp(-1), "1969-12-31T23:59:59.999Z"),
        (b"abc", "abc"),
        ("é".encode(), "é"),
        (b"\xff\x00\x10", "ff0010"),
        (b"", ""),
        (UID, "12345678-1234-5678-1234-567812345678"),
    ],
)
def test_to_text(value: Any, text: str | None) -> None:
    assert to_text(value) == text


# =========================================================================== BatchBuilder

CHUNK_TS = 1_700_000_000_999
CHUNK_TS_US = CHUNK_TS * 1000


def _ts(col: pa.Array) -> list[int | None]:
    return col.cast(pa.int64()).to_pylist()


def test_batch_fixed_columns() -> None:
    chunk = b"".join(entry(m) for m in MESSAGES)
    b = BatchBuilder("orders", ())
    assert b.flush() is None
    b.add_chunk(chunk, len(MESSAGES), 1, 3, 101, CHUNK_TS)
    b.add_chunk(entry(encode(b"next")), 1, 0, 1, 200, CHUNK_TS + 1)
    batch = b.flush()
    assert batch is not None
    assert batch.schema == source_arrow_schema(())
    assert batch.schema.names == ["value", "stream", "offset", "chunk_timestamp"]
    assert batch.column("value").to_pylist() == [*BODIES[1:4], b"next"]
    assert batch.column("stream").to_pylist() == ["orders"] * 4
    assert batch.column("offset").to_pylist() == [101, 102, 103, 200]
    assert batch.column("chunk_timestamp").type == TS
    assert _ts(batch.column("chunk_timestamp")) == [CHUNK_TS_US] * 3 + [CHUNK_TS_US + 1000]
    assert batch.column("chunk_timestamp")[0].as_py() == datetime(2023, 11, 14, 22, 13, 20, 999000, UTC)
    assert b.flush() is None


def test_batch_fixed_columns_from_sub_entries_and_empty_stream_name() -> None:
    m = [encode(b"0"), encode(b"1"), encode(b"2")]
    chunk = entry(m[0]) + sub_entry(m[1:], "zstd")
    b = BatchBuilder("", ())
    b.add_chunk(chunk, 2, 1, 2, 11, CHUNK_TS)
    batch = b.flush()
    assert batch is not None
    assert batch.column("value").to_pylist() == [b"1", b"2"]
    assert batch.column("stream").to_pylist() == ["", ""]
    assert batch.column("offset").to_pylist() == [11, 12]


def _metadata_chunk() -> tuple[bytes, int]:
    m0 = encode(
        b"first",
        {
            "message_id": "m-0",
            "user_id": b"guest",
            "to": "to",
            "subject": "subj",
            "reply_to": "rt",
            "correlation_id": "c-0",
            "content_type": "text/plain",
            "content_encoding": "utf-8",
            "absolute_expiry_time": EXPIRY,
            "creation_time": T0,
            "group_id": "g",
            "group_sequence": 9,
            "reply_to_group_id": "rg",
        },
        {"routing_key": "rk-0", "n": 5, "flag": True},
        {"x-opt": "v", "x-ts": T0_DT},
    )
    m1 = rs(
        body=b"second",
        properties=Properties(message_id=UID, correlation_id=b"\xff\xfe", creation_time=T0 + 1),
        application_properties={"routing_key": 77, "bin": b"\x00\xff"},
    )
    m2 = encode(b"third", None, {"other": "x"})
    m3 = b"not amqp"
    m4 = rs(value="fifth", message_annotations={"x-n": 1})
    chunk = entry(m0) + sub_entry([m1, m2], "gzip") + entry(m3) + entry(m4)
    return chunk, 4


def test_batch_all_metadata_fields() -> None:
    chunk, entries = _metadata_chunk()
    b = BatchBuilder("s1", METADATA_FIELDS)
    b.add_chunk(chunk, entries, 0, 5, 1000, CHUNK_TS)
    batch = b.flush()
    assert batch is not None
    assert batch.schema == source_arrow_schema(METADATA_FIELDS)
    assert batch.schema.names == [
        "value",
        "stream",
        "offset",
        "chunk_timestamp",
        "properties",
        "application_properties",
        "message_annotations",
        "creation_time",
        "routing_key",
    ]
    assert batch.column("value").to_pylist() == [b"first", b"second", b"third", b"not amqp", b"fifth"]
    assert batch.column("stream").to_pylist() == ["s1"] * 5
    assert batch.column("offset").to_pylist() == [1000, 1001, 1002, 1003, 1004]
    assert _ts(batch.column("chunk_timestamp")) == [CHUNK_TS_US] * 5

    nulls = dict.fromkeys(PROPERTY_NAMES)
    assert batch.column("properties").to_pylist() == [
        {
            "message_id": "m-0",
            "user_id": b"guest",
            "to": "to",
            "subject": "subj",
            "reply_to": "rt",
            "correlation_id": "c-0",
            "content_type": "text/plain",
            "content_encoding": "utf-8",
            "absolute_expiry_time": EXPIRY_DT,
            "creation_time": T0_DT,
            "group_id": "g",
            "group_sequence": 9,
            "reply_to_group_id": "rg",
        },
        {
            **nulls,
            "message_id": "12345678-1234-5678-1234-567812345678",
            "correlation_id": "fffe",
            "creation_time": T0_DT + timedelta(milliseconds=1),
        },
        None,
        None,
        None,
    ]
    props = batch.column("properties")
    assert _ts(props.field("creation_time")) == [T0 * 1000, (T0 + 1) * 1000, None, None, None]
    assert _ts(props.field("absolute_expiry_time")) == [EXPIRY * 1000, None, None, None, None]
    assert batch.column("application_properties").to_pylist() == [
        [("routing_key", "rk-0"), ("n", "5"), ("flag", "true")],
        [("routing_key", "77"), ("bin", "00ff")],
        [("other", "x")],
        None,
        None,
    ]
    assert batch.column("message_annotations").to_pylist() == [
        [("x-opt", "v"), ("x-ts", "2023-11-14T22:13:20.123Z")],
        None,
        None,
        None,
        [("x-n", "1")],
    ]
    assert batch.column("creation_time").type == TS
    assert _ts(batch.column("creation_time")) == [T0 * 1000, (T0 + 1) * 1000, None, None, None]
    assert batch.column("creation_time").to_pylist() == props.field("creation_time").to_pylist()
    assert batch.column("routing_key").to_pylist() == ["rk-0", "77", None, None, None]


@pytest.mark.parametrize(
    "fields",
    [("routing_key",), ("creation_time",), ("message_annotations", "properties"), METADATA_FIELDS[::-1]],
)
def test_batch_schema_for_field_subsets(fields: tuple[str, ...]) -> None:
    chunk, entries = _metadata_chunk()
    b = BatchBuilder("s1", fields)
    b.add_chunk(chunk, entries, 1, 2, 1001, CHUNK_TS)
    batch = b.flush()
    assert batch is not None
    assert batch.schema == source_arrow_schema(fields)
    assert batch.column("value").to_pylist() == [b"second", b"third"]
    assert batch.column("offset").to_pylist() == [1001, 1002]
    if "routing_key" in fields:
        assert batch.column("routing_key").to_pylist() == ["77", None]
    if "creation_time" in fields:
        assert _ts(batch.column("creation_time")) == [(T0 + 1) * 1000, None]


def test_batch_add_matches_add_chunk() -> None:
    chunk, entries = _metadata_chunk()
    a = BatchBuilder("s1", METADATA_FIELDS)
    a.add_chunk(chunk, entries, 0, 5, 1000, CHUNK_TS)
    b = BatchBuilder("s1", METADATA_FIELDS)
    b.add(chunk_records(chunk, entries), 1000, CHUNK_TS)
    assert a.flush() == b.flush()
    c = BatchBuilder("s1", ())
    c.add(chunk_records(chunk, entries), 1000, CHUNK_TS)
    d = BatchBuilder("s1", ())
    d.add_chunk(chunk, entries, 0, 5, 1000, CHUNK_TS)
    assert c.flush() == d.flush()


def test_batch_strict_decoding_rejects_non_amqp() -> None:
    chunk, entries = _metadata_chunk()
    b = BatchBuilder("s1", ("properties",), strict=True)
    b.add_chunk(chunk, entries, 0, 5, 1000, CHUNK_TS)
    with pytest.raises(DataError, match=r"offset 1003 of stream 's1' is not valid AMQP 1\.0"):
        b.flush()


# =========================================================================== round trip

_keys = st.text(max_size=20)
_text_values = st.text(max_size=300)
_values = st.one_of(
    _text_values,
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)


def _as_text(v: str | bool | int | float) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


@given(
    body=st.binary(max_size=1000),
    app=st.dictionaries(_keys, _text_values, max_size=12),
    ann=st.dictionaries(_keys, _values, max_size=12),
    message_id=st.one_of(st.none(), st.text(max_size=300)),
)
def test_round_trip(body: bytes, app: dict[str, str], ann: dict[str, Any], message_id: str | None) -> None:
    m = encode(body, {"message_id": message_id}, app, ann)
    d = decode(mv(m))
    assert d.body == body
    assert (d.application_properties or {}) == app
    got = {to_text(k): to_text(v) for k, v in (d.message_annotations or {}).items()}
    assert got == {k: _as_text(v) for k, v in ann.items()}
    assert d.properties == (None if message_id is None else [message_id])
    assert bodies([mv(m)]) == [body]
    assert chunk_bodies(entry(m) + entry(m), 2, 1, 1) == [body]
    # rstream agrees
    r = amqp_decoder(m)
    assert r.body == body
    assert (r.application_properties or {}) == {k.encode(): v.encode() for k, v in app.items()}
