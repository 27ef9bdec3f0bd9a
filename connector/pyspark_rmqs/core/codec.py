"""AMQP 1.0 messages <-> values: no chunk framing, no compression (those are `chunks.py`).

`bodies` pulls only the body out of each message (the fast path for the fixed columns), `decode`
pulls everything; `encode` / `encode_body` build message bytes from values. Pure Python on
memoryviews: no per-message objects from rstream.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark_rmqs.core.errors import DataError
from pyspark_rmqs.core.schema import PROPERTY_NAMES

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")

# Section descriptors (small ulong codes).
HEADER, DELIVERY_ANN, MESSAGE_ANN, PROPERTIES, APP_PROPS, DATA, SEQUENCE, VALUE, FOOTER = range(0x70, 0x79)

# --------------------------------------------------------------------------- skipping and decoding


def _skip(b: memoryview, p: int) -> int:
    """Position after the AMQP value starting at `p` (descriptors included)."""
    c = b[p]
    if c == 0x00:
        return _skip(b, _skip(b, p + 1))
    w = c >> 4
    if w == 4:
        return p + 1
    if w == 5:
        return p + 2
    if w == 6:
        return p + 3
    if w == 7:
        return p + 5
    if w == 8:
        return p + 9
    if w == 9:
        return p + 17
    if w == 0xA or w == 0xC or w == 0xE:
        return p + 2 + b[p + 1]
    if w == 0xB or w == 0xD or w == 0xF:
        return p + 5 + _U32.unpack_from(b, p + 1)[0]
    raise ValueError(f"invalid AMQP type code 0x{c:02x} at {p}")


def _descriptor(b: memoryview, p: int) -> tuple[int, int]:
    """(section code, position of the described value) for a described type at `p`."""
    if b[p] != 0x00:
        raise ValueError("expected a described section")
    c = b[p + 1]
    if c == 0x53:
        return b[p + 2], p + 3
    if c == 0x80:
        return _U64.unpack_from(b, p + 2)[0], p + 10
    if c in (0xA3, 0xB3):  # symbolic descriptor, e.g. amqp:data:binary
        end = _skip(b, p + 1)
        name = bytes(b[p + 3 if c == 0xA3 else p + 6 : end]).decode()
        return _SYMBOLIC.get(name, -1), end
    raise ValueError(f"unsupported descriptor 0x{c:02x}")


_SYMBOLIC = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANN,
    "amqp:message-annotations:map": MESSAGE_ANN,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APP_PROPS,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": SEQUENCE,
    "amqp:amqp-value:*": VALUE,
    "amqp:footer:map": FOOTER,
}


def _compound(b: memoryview, p: int) -> tuple[int, int, int]:
    """(count, position of the first element, end) of a list or map at `p`, checked: the elements
    must fit in the size it declares, inside the message, and every element takes at least a byte.

    Without the check an element could run past its list's end, which the list then returned: lists
    of a few bytes each, nested in one another and overlapping, decode into a structure exponential
    in the message's length (a 113-byte message took 2.6 s and 213 MB, 40 more bytes ~20 GB: CI saw
    a test worker OOM-killed at 20 GB by a fuzzed message)."""
    c = b[p]
    if c == 0x45:
        return 0, p + 1, p + 1
    if c in (0xC0, 0xC1):
        count, first, end = b[p + 2], p + 3, p + 2 + b[p + 1]
    elif c in (0xD0, 0xD1):
        size, count = struct.unpack_from(">II", b, p + 1)
        first, end = p + 9, p + 5 + size
    else:
        raise ValueError(f"expected a list or map, found type code 0x{c:02x}")
    if end < first or end > len(b) or count > end - first:
        raise ValueError(f"the list or map at {p} declares {count} elements in {end - first} bytes")
    return count, first, end


def _within(q: int, end: int, p: int) -> int:
    """`q`, once checked to be inside the list or map at `p` that ends at `end`."""
    if q > end:
        raise ValueError(f"an element of the list or map at {p} runs past its declared size")
    return q


def _value(b: memoryview, p: int) -> tuple[Any, int]:
    """Decode one AMQP value: str, bytes, int, float, bool, None, UUID, Timestamp, list or dict."""
    c = b[p]
    if c == 0x00:  # described value: keep the value, drop the descriptor
        return _value(b, _skip(b, p + 1))
    if c == 0xA1 or c == 0xA3:
        n = b[p + 1]
        return str(b[p + 2 : p + 2 + n], "utf-8"), p + 2 + n
    if c == 0xB1 or c == 0xB3:
        n = _U32.unpack_from(b, p + 1)[0]
        return str(b[p + 5 : p + 5 + n], "utf-8"), p + 5 + n
    if c == 0xA0:
        n = b[p + 1]
        return bytes(b[p + 2 : p + 2 + n]), p + 2 + n
    if c == 0xB0:
        n = _U32.unpack_from(b, p + 1)[0]
        return bytes(b[p + 5 : p + 5 + n]), p + 5 + n
    if c == 0x40:
        return None, p + 1
    if c == 0x41:
        return True, p + 1
    if c == 0x42:
        return False, p + 1
    if c == 0x56:
        return b[p + 1] != 0, p + 2
    if c in (0x43, 0x44):
        return 0, p + 1
    if c in (0x50, 0x52, 0x53):
        return b[p + 1], p + 2
    if c in (0x51, 0x54, 0x55):
        return struct.unpack_from(">b", b, p + 1)[0], p + 2
    if c == 0x60:
        return _U16.unpack_from(b, p + 1)[0], p + 3
    if c == 0x61:
        return struct.unpack_from(">h", b, p + 1)[0], p + 3
    if c == 0x70:
        return _U32.unpack_from(b, p + 1)[0], p + 5
    if c == 0x71:
        return struct.unpack_from(">i", b, p + 1)[0], p + 5
    if c == 0x72:
        return struct.unpack_from(">f", b, p + 1)[0], p + 5
    if c == 0x80:
        return _U64.unpack_from(b, p + 1)[0], p + 9
    if c == 0x81:
        return _I64.unpack_from(b, p + 1)[0], p + 9
    if c == 0x82:
        return struct.unpack_from(">d", b, p + 1)[0], p + 9
    if c == 0x83:
        return Timestamp(_I64.unpack_from(b, p + 1)[0]), p + 9
    if c == 0x98:
        return uuid.UUID(bytes=bytes(b[p + 1 : p + 17])), p + 17
    if c == 0x73:
        code = _U32.unpack_from(b, p + 1)[0]
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:  # not a character UTF-8 (and Arrow) can hold
            raise ValueError(f"invalid AMQP char 0x{code:x} at {p}")
        return chr(code), p + 5
    if c in (0xC0, 0xD0, 0x45):
        count, q, end = _compound(b, p)
        items = []
        for _ in range(count):
            v, q = _value(b, q)
            items.append(v)
            q = _within(q, end, p)
        return items, end
    if c in (0xC1, 0xD1):
        count, q, end = _compound(b, p)
        d: dict[Any, Any] = {}
        for _ in range(count // 2):
            k, q = _value(b, q)
            q = _within(q, end, p)
            v, q = _value(b, q)
            q = _within(q, end, p)
            if isinstance(k, list | dict):
                raise ValueError(f"unsupported AMQP map key (a {type(k).__name__}) in the map at {p}")
            d[k] = v
        return d, end
    # decimals and arrays: keep their raw bytes rather than fail the whole message
    end = _skip(b, p)
    return bytes(b[p:end]), end


class Timestamp(int):
    """An AMQP timestamp: epoch milliseconds, kept apart from plain integers."""


def small_data_body(m: memoryview) -> bytes | None:
    """The body of a message that is exactly one small data section (what most producers send)."""
    n = len(m)
    if n > 4 and m[0] == 0x00 and m[1] == 0x53 and m[2] == 0x75 and m[3] == 0xA0 and m[4] + 5 == n:
        return bytes(m[5:])
    return None


def bodies(records: Sequence[memoryview]) -> list[bytes]:
    """Only the body of each message: data sections (joined), or an amqp-value of binary or string.

    A record that is not a valid AMQP 1.0 message yields its raw bytes.
    """
    out: list[bytes] = []
    append = out.append
    for m in records:
        body = small_data_body(m)
        if body is not None:
            append(body)
            continue
        try:
            append(_body(m))
        except (ValueError, IndexError, struct.error, RecursionError):
            append(bytes(m))
    return out


def _body(m: memoryview) -> bytes:
    p, n = 0, len(m)
    parts: list[bytes] = []
    value: Any = None
    while p < n:
        code, q = _descriptor(m, p)
        if code == DATA:
            v, p = _value(m, q)
            parts.append(_binary(v))
        elif code == VALUE:
            value, p = _value(m, q)
        else:
            p = _skip(m, q)
    if p != n:
        raise ValueError("truncated message")
    if parts:
        return parts[0] if len(parts) == 1 else b"".join(parts)
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if value is None:
        return b""
    return str(value).encode()


@dataclass(slots=True)
class Decoded:
    """Everything the source schema can hold for one message."""

    body: bytes
    properties: list[Any] | None = None
    application_properties: dict[Any, Any] | None = None
    message_annotations: dict[Any, Any] | None = None


def decode(m: memoryview) -> Decoded:
    """Decode a whole message; raises ValueError when it is not valid AMQP 1.0."""
    try:
        return _decode(m)
    except (IndexError, struct.error, RecursionError) as e:  # truncated or absurdly nested input
        raise ValueError(f"malformed AMQP 1.0 message: {e}") from e


def _decode(m: memoryview) -> Decoded:
    p, n = 0, len(m)
    parts: list[bytes] = []
    value: Any = None
    has_value = False
    out = Decoded(b"")
    while p < n:
        code, q = _descriptor(m, p)
        if code == DATA:
            v, p = _value(m, q)
            parts.append(_binary(v))
        elif code == VALUE:
            value, p = _value(m, q)
            has_value = True
        elif code == PROPERTIES:
            props, p = _value(m, q)
            out.properties = _properties(props)
        elif code == APP_PROPS:
            app, p = _value(m, q)
            out.application_properties = _map("application-properties", app)
        elif code == MESSAGE_ANN:
            ann, p = _value(m, q)
            out.message_annotations = _map("message-annotations", ann)
        else:
            p = _skip(m, q)
    if p != n:
        raise ValueError("trailing bytes after the last section")
    if parts:
        out.body = parts[0] if len(parts) == 1 else b"".join(parts)
    elif has_value:
        out.body = value if isinstance(value, bytes) else (b"" if value is None else str(value).encode())
    return out


def _binary(v: Any) -> bytes:
    if not isinstance(v, bytes):
        raise ValueError(f"a data section holds a {type(v).__name__}, not binary")
    return v


_MS_MAX = (2**63 - 1) // 1000  # timestamps become microseconds in Arrow (int64)


def _properties(v: Any) -> list[Any] | None:
    """The properties list, checked where the source columns need a type (timestamps, int64)."""
    if v is None:
        return None
    if not isinstance(v, list):
        raise ValueError(f"the properties section is a {type(v).__name__}, not a list")
    for i, name, limit in (
        (8, "absolute-expiry-time", _MS_MAX),
        (9, "creation-time", _MS_MAX),
        (11, "group-sequence", 2**63 - 1),
    ):
        x = v[i] if i < len(v) else None
        if x is not None and (not isinstance(x, int) or not -limit <= x <= limit):
            raise ValueError(f"properties {name} is not an integer in range (a {type(x).__name__})")
    return v


def _map(section: str, v: Any) -> dict[Any, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError(f"the {section} section is a {type(v).__name__}, not a map")
    if None in v:
        raise ValueError(f"the {section} section has a null key")
    return v


def to_text(v: Any) -> str | None:
    """SPEC.md's lossy coercion of property and annotation values to strings."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Timestamp):
        try:
            dt = datetime.fromtimestamp(v / 1000, UTC)
        except (OverflowError, ValueError, OSError):  # beyond datetime's years 1..9999
            return str(int(v))
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v.hex()
    return str(v)


# --------------------------------------------------------------------------- encoding


def _enc_str(s: str, sym: bool = False) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) < 256:
        return bytes((0xA3 if sym else 0xA1, len(raw))) + raw
    return bytes((0xB3 if sym else 0xB1,)) + _U32.pack(len(raw)) + raw


def _enc_bin(raw: bytes) -> bytes:
    if len(raw) < 256:
        return bytes((0xA0, len(raw))) + raw
    return b"\xb0" + _U32.pack(len(raw)) + raw


def _enc_ts(ms: int) -> bytes:
    return b"\x83" + _I64.pack(ms)


def _enc_list(items: Sequence[bytes]) -> bytes:
    body = b"".join(items)
    if len(body) + 1 < 256 and len(items) < 256:
        return bytes((0xC0, len(body) + 1, len(items))) + body
    return b"\xd0" + struct.pack(">II", len(body) + 4, len(items)) + body


def _enc_map(pairs: Sequence[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(k + v for k, v in pairs)
    count = 2 * len(pairs)
    if len(body) + 1 < 256 and count < 256:
        return bytes((0xC1, len(body) + 1, count)) + body
    return b"\xd1" + struct.pack(">II", len(body) + 4, count) + body


def encode_body(body: bytes) -> bytes:
    """A message that is just one data section: the fast path for value-only writes."""
    n = len(body)
    if n < 256:
        return b"\x00\x53\x75\xa0" + bytes((n,)) + body
    return b"\x00\x53\x75\xb0" + _U32.pack(n) + body


def _section(code: int, value: bytes) -> bytes:
    return bytes((0x00, 0x53, code)) + value


def _enc_prop(name: str, v: Any) -> bytes:
    if v is None:
        return b"\x40"
    if name in ("absolute_expiry_time", "creation_time"):
        return _enc_ts(to_millis(v))
    if name == "user_id":
        return _enc_bin(bytes(v))
    if name == "group_sequence":
        return b"\x70" + _U32.pack(_sequence_no(v))
    if name in ("content_type", "content_encoding"):
        return _enc_str(str(v), sym=True)
    return _enc_str(str(v))


_UINT_MAX = 2**32 - 1


def _sequence_no(v: Any) -> int:
    """`group_sequence` as an AMQP sequence-no (a uint): a value outside 0..2**32-1 is a DataError.

    Wrapping it (-1 -> 4294967295) would publish a different number than the row holds.
    """
    n = int(v)
    if not 0 <= n <= _UINT_MAX:
        raise DataError(
            f"column 'properties.group_sequence' must be between 0 and {_UINT_MAX} "
            f"(an AMQP sequence-no), got {n}"
        )
    return n


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLI = timedelta(milliseconds=1)


def to_millis(v: Any) -> int:
    """Epoch millis from a datetime (naive = UTC) or an int."""
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return (v - _EPOCH) // _MILLI  # exact: float timestamp() * 1000 can lose a millisecond
    return int(v)


def encode(
    body: bytes,
    properties: Mapping[str, Any] | None = None,
    application_properties: Mapping[str, Any] | None = None,
    message_annotations: Mapping[str, Any] | None = None,
) -> bytes:
    """An AMQP 1.0 message: message-annotations, properties, application-properties, one data section."""
    out: list[bytes] = []
    if message_annotations:
        pairs = [(_enc_str(str(k), sym=True), _enc_any(v)) for k, v in message_annotations.items()]
        out.append(_section(MESSAGE_ANN, _enc_map(pairs)))
    if properties and any(properties.get(n) is not None for n in PROPERTY_NAMES):
        fields = [_enc_prop(n, properties.get(n)) for n in PROPERTY_NAMES]
        while fields and fields[-1] == b"\x40":
            fields.pop()
        out.append(_section(PROPERTIES, _enc_list(fields)))
    if application_properties:
        pairs = [(_enc_str(str(k)), _enc_any(v)) for k, v in application_properties.items()]
        out.append(_section(APP_PROPS, _enc_map(pairs)))
    out.append(_section(DATA, _enc_bin(body)))
    return b"".join(out)


def _enc_any(v: Any) -> bytes:
    if v is None:
        return b"\x40"
    if isinstance(v, bool):
        return b"\x41" if v else b"\x42"
    if isinstance(v, int):
        return b"\x81" + _I64.pack(v)
    if isinstance(v, float):
        return b"\x82" + struct.pack(">d", v)
    if isinstance(v, bytes | bytearray):
        return _enc_bin(bytes(v))
    if isinstance(v, datetime):
        return _enc_ts(to_millis(v))
    return _enc_str(str(v))
