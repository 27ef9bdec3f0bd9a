"""Arrow <-> messages, both directions: chunks -> RecordBatches (read), rows -> messages (write).

Reading: columns are built from whole slices of chunks: offsets and chunk timestamps from buffers,
values with one C-level conversion; the per-message Python work is only finding each body. Metadata
columns decode each message fully and are built only when `metadataFields` asks for them.

Writing: `encode_row` is the one encoder of a message from a row (the Spark sink's rows through
`MessageEncoder`, `produce.publish`'s dicts): `value`, `properties` (with `creation_time`),
`application_properties` (a `routing_key` is stored there too, where the source's `routing_key`
column reads it from) and `message_annotations`; a row with only a value is one data section.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_rmqs.core import chunks, codec
from pyspark_rmqs.core.errors import DataError
from pyspark_rmqs.core.schema import (
    PROPERTIES_FIELDS,
    PROPERTIES_TYPE,
    SINK_COLUMNS,
    STRING_MAP,
    TS,
    source_arrow_schema,
)

_STRING_PROPS = {"message_id", "correlation_id"}
_TS_PROPS = {"absolute_expiry_time", "creation_time"}


class BatchBuilder:
    """Accumulates chunk slices and emits RecordBatches of `source_arrow_schema(metadata_fields)`."""

    def __init__(self, stream: str, metadata_fields: Sequence[str], strict: bool = False) -> None:
        self.stream = stream
        self.fields = tuple(metadata_fields)
        self.full = bool(self.fields)
        self.strict = strict
        self.schema = source_arrow_schema(self.fields)
        self._stream_bytes = stream.encode("utf-8")
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        # the fixed columns' bodies, in order: chunk slices found by chunks.body_spans, or bodies
        self.pieces: list[tuple[bytes, list[int]] | list[bytes]] = []
        self.records: list[memoryview] = []
        self.offsets = array("q")
        self.timestamps = array("q")

    def add_chunk(
        self, data: bytes, num_entries: int, skip: int, take: int, first_offset: int, ts: int
    ) -> None:
        """Add records `[skip, skip + take)` of a chunk whose record `skip` has offset `first_offset`."""
        if not self.full and chunks.VECTORISED:
            spans = chunks.body_spans(data, skip, take)
            if spans is not None:  # checked and sliced at flush, for the whole batch at once
                self.pieces.append((data, spans))
                self._positions(take, first_offset, ts)
                return
        try:
            if self.full:
                got: list[Any] = chunks.chunk_records(data, num_entries)[skip : skip + take]
            else:
                got = chunks.chunk_bodies(data, num_entries, skip, take)
            if len(got) != take:
                raise DataError(f"corrupt chunk: it holds {len(got)} of the {take} records asked for")
        except DataError as e:
            raise DataError(
                f"cannot read the chunk at offset {first_offset - skip} of stream '{self.stream}': {e}"
            ) from e
        if self.full:
            self.records.extend(got)
        else:
            self.pieces.append(got)
        self._positions(take, first_offset, ts)

    def add(self, records: Sequence[memoryview], first_offset: int, timestamp_ms: int) -> None:
        """Add consecutive messages starting at `first_offset`, all from one chunk."""
        if self.full:
            self.records.extend(records)
        else:
            self.pieces.append(codec.bodies(records))
        self._positions(len(records), first_offset, timestamp_ms)

    def _positions(self, n: int, first_offset: int, timestamp_ms: int) -> None:
        self.offsets.extend(range(first_offset, first_offset + n))
        self.timestamps.extend(array("q", [timestamp_ms * 1000]) * n)
        self.rows += n

    def flush(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        n = self.rows
        offsets = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self.offsets)])
        ts = pa.Array.from_buffers(TS, n, [None, pa.py_buffer(self.timestamps)])
        stream_col = _repeat_string(self._stream_bytes, n)
        if self.full:
            cols = self._full_columns(offsets)
            arrays = [cols.pop("value"), stream_col, offsets, ts, *(cols[f] for f in self._ordered())]
        else:
            arrays = [self._values(), stream_col, offsets, ts]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._reset()
        return batch

    def _values(self) -> pa.Array:
        """The value column: runs of chunk spans gathered at once, lists of bodies as they are."""
        parts: list[pa.Array] = []
        spans: list[tuple[bytes, list[int]]] = []
        for piece in self.pieces:
            if isinstance(piece, tuple):
                spans.append(piece)
                continue
            if spans:
                parts.append(chunks.bodies_array(spans))
                spans = []
            parts.append(chunks.binary_array(piece))
        if spans:
            parts.append(chunks.bodies_array(spans))
        if len(parts) == 1:
            return parts[0]
        return pa.concat_arrays(parts) if parts else chunks.binary_array([])

    def _ordered(self) -> list[str]:
        return [f.name for f in self.schema][4:]

    def _full_columns(self, offsets: pa.Array) -> dict[str, pa.Array]:
        want = set(self.fields)
        values: list[bytes] = []
        props: list[list[Any] | None] = []
        apps: list[dict[Any, Any] | None] = []
        anns: list[dict[Any, Any] | None] = []
        for i, m in enumerate(self.records):
            body = codec.small_data_body(m)
            if body is not None:  # one data section: no metadata to decode
                values.append(body)
                props.append(None)
                apps.append(None)
                anns.append(None)
                continue
            try:
                d = codec.decode(m)
            except (ValueError, IndexError, UnicodeDecodeError) as e:
                if self.strict:
                    raise DataError(
                        f"message at offset {self.offsets[i]} of stream '{self.stream}' is not valid "
                        f"AMQP 1.0 ({e}); set strictDecoding=false to read its raw bytes as value"
                    ) from e
                values.append(bytes(m))
                props.append(None)
                apps.append(None)
                anns.append(None)
                continue
            values.append(d.body)
            props.append(d.properties)
            apps.append(d.application_properties)
            anns.append(d.message_annotations)
        out: dict[str, pa.Array] = {"value": pa.array(values, pa.binary())}
        if "properties" in want:
            out["properties"] = _properties_array(props)
        if "creation_time" in want:
            at = _NAMES.index("creation_time")
            out["creation_time"] = pa.array(
                [_property("creation_time", p[at]) if p is not None and len(p) > at else None for p in props],
                TS,
            )
        if "application_properties" in want:
            out["application_properties"] = _map_array(apps)
        if "message_annotations" in want:
            out["message_annotations"] = _map_array(anns)
        if "routing_key" in want:
            out["routing_key"] = pa.array(
                [codec.to_text(_get(a, "routing_key")) if a else None for a in apps], pa.string()
            )
        return out


def value_bytes(batch: pa.RecordBatch) -> int:
    """Bytes of the message bodies (the `value` column) in a source batch: one vectorised sum.

    A run's `bytes_read`, counted the same way by the Spark-free consume and the Spark tasks."""
    return int(pc.sum(pc.binary_length(batch.column("value"))).as_py() or 0)


def _repeat_string(raw: bytes, n: int) -> pa.Array:
    """A string column holding `raw` n times, built from buffers (no Python objects per row)."""
    size = len(raw)
    offsets = array("i", range(0, size * (n + 1), size)) if size else array("i", bytes(4 * (n + 1)))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _get(d: dict[Any, Any], key: str) -> Any:
    return d.get(key)


def _property(name: str, v: Any) -> Any:
    if v is None:
        return None
    if name in _TS_PROPS:
        return int(v) * 1000
    if name == "user_id":
        return v if isinstance(v, bytes) else str(v).encode()
    if name == "group_sequence":
        return int(v)
    return codec.to_text(v)


_NAMES = [name for name, _t, _d in PROPERTIES_FIELDS]


def _properties_array(props: list[list[Any] | None]) -> pa.StructArray:
    """Rows without a properties section cost nothing here: pyarrow builds the struct from dicts."""
    n = len(props)
    if all(p is None for p in props):
        children = [pa.nulls(n, t) for _n, t, _d in PROPERTIES_FIELDS]
        return pa.StructArray.from_arrays(children, fields=list(PROPERTIES_TYPE), mask=pa.array([True] * n))
    rows = [
        None if p is None else {name: _property(name, v) for name, v in zip(_NAMES, p, strict=False)}
        for p in props
    ]
    struct = pa.array(rows, PROPERTIES_TYPE)
    if not struct.null_count:
        return struct
    # Null rows: make their fields null too (Arrow leaves them as zeros), so a field read alone is right.
    valid = struct.is_valid()
    children = [
        pc.if_else(valid, struct.field(i), pa.scalar(None, t))
        for i, (_n, t, _d) in enumerate(PROPERTIES_FIELDS)
    ]
    return pa.StructArray.from_arrays(children, fields=list(PROPERTIES_TYPE), mask=struct.is_null())


def _map_array(maps: list[dict[Any, Any] | None]) -> pa.MapArray:
    if all(m is None for m in maps):
        return pa.nulls(len(maps), STRING_MAP)
    offsets = [0]
    keys: list[str | None] = []
    items: list[str | None] = []
    mask = []
    for m in maps:
        mask.append(m is None)
        if m:
            for k, v in m.items():
                keys.append(codec.to_text(k))
                items.append(codec.to_text(v))
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(items, pa.string()),
        type=STRING_MAP,
        mask=pa.array(mask, pa.bool_()),
    )


# --------------------------------------------------------------------------- rows -> messages


def message_body(value: Any, where: str) -> bytes:
    """A message body from a `value` (bytes or str, UTF-8); `where` names the row in errors."""
    if value is None:
        raise DataError(f"{where} has a null 'value'; every message needs a body")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise DataError(f"{where}: a message value must be bytes or str, got {type(value).__name__}")


def encode_row(row: Mapping[str, Any], where: str) -> bytes:
    """One message from a row of sink columns (or a dict of them); `where` names it in errors."""
    body = message_body(row.get("value"), where)
    props = dict(row.get("properties") or {})
    if row.get("creation_time") is not None:
        props["creation_time"] = row["creation_time"]
    app = dict(row.get("application_properties") or {})
    if row.get("routing_key") is not None:
        app.setdefault("routing_key", str(row["routing_key"]))
    ann = dict(row.get("message_annotations") or {})
    if not props and not app and not ann:
        return codec.encode_body(body)
    return codec.encode(body, props or None, app or None, ann or None)


def filter_value(path: str | None, row: Mapping[str, Any]) -> str | None:
    """The filter value `filterValuePath` names in a row: `routing_key` or `<section>.<key>`."""
    if path is None:
        return None
    if path == "routing_key":
        v = row.get("routing_key")
    else:
        head, _, key = path.partition(".")
        section = row.get(head)
        if head == "properties":
            v = section.get(key) if isinstance(section, dict) else None
        else:
            v = dict(section).get(key) if section else None
    return None if v is None else str(codec.to_text(v))


def encode_bodies(values: pa.Array) -> list[bytes]:
    """Body-only messages (one AMQP data section each) for a whole `value` column, vectorised.

    The same bytes as `codec.encode_body` per value, without a Python step per row: each message
    is a 5-byte header (`vbin8`, bodies under 256 bytes) or an 8-byte one (`vbin32`) followed by
    the body; the headers are built as one numpy array and joined to the bodies by Arrow. Needs
    numpy (`chunks.VECTORISED`) and a column without nulls; `MessageEncoder` checks both.
    """
    import numpy as np

    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary() if pa.types.is_large_string(values.type) else pa.binary())
    n = len(values)
    lens = pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.uint32)
    short = lens < 256
    head = np.empty((n, 8), np.uint8)
    head[:, :3] = (0x00, 0x53, 0x75)  # described type: the data section
    head[:, 3] = np.where(short, 0xA0, 0xB0)  # vbin8 / vbin32
    size = lens.astype(">u4").view(np.uint8).reshape(n, 4)
    head[:, 4] = np.where(short, lens.astype(np.uint8), size[:, 0])
    head[:, 5:] = size[:, 1:]
    head_len = np.where(short, 5, 8).astype(np.int64)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(head_len, out=offsets[1:])
    data = head[np.arange(8)[None, :] < head_len[:, None]]  # each row's first 5 or 8 bytes
    headers = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    if headers.type != values.type:
        headers = headers.cast(values.type)
    separator = pa.scalar(b"", values.type)
    messages: list[bytes] = pc.binary_join_element_wise(headers, values, separator).to_pylist()
    return messages


class MessageEncoder:
    """One Arrow batch -> (messages, routing keys, filter values); rows numbered across batches.

    `stream` (a plain stream's name) makes a `stream` column that names another stream an error;
    None (a super stream) routes by `routing_key` instead.
    """

    def __init__(
        self, columns: Sequence[str], *, filter_value_path: str | None = None, stream: str | None = None
    ) -> None:
        self.columns = [c for c in columns if c in SINK_COLUMNS]
        self.filter_value_path = filter_value_path
        self.stream = stream
        self.body_only = set(self.columns) <= {"value", "stream"} and not filter_value_path
        self.rows_seen = 0

    def encode(
        self, batch: pa.RecordBatch
    ) -> tuple[list[bytes], list[str | None] | None, list[str | None] | None]:
        names = batch.schema.names
        values_column = batch.column(names.index("value"))
        base = self.rows_seen
        self.rows_seen += len(values_column)
        self._check_stream(batch, names, base)
        keys = batch.column(names.index("routing_key")).to_pylist() if "routing_key" in names else None
        if self.body_only:
            if chunks.VECTORISED and values_column.null_count == 0:
                return encode_bodies(values_column), keys, None
            values = values_column.to_pylist()
            msgs = []
            for i, v in enumerate(values):
                if not isinstance(v, bytes):  # a str, or a null: the error names the row
                    v = message_body(v, f"row {base + i} of this task")
                msgs.append(codec.encode_body(v))
            return msgs, keys, None
        msgs = []
        filters: list[str | None] | None = [] if self.filter_value_path else None
        for i, row in enumerate(batch.to_pylist()):
            msgs.append(encode_row(row, f"row {base + i} of this task"))
            if filters is not None:
                filters.append(filter_value(self.filter_value_path, row))
        return msgs, keys, filters

    def _check_stream(self, batch: pa.RecordBatch, names: list[str], base: int) -> None:
        if self.stream is None or "stream" not in names:
            return
        for i, s in enumerate(batch.column(names.index("stream")).to_pylist()):
            if s != self.stream:
                raise DataError(
                    f"row {base + i} of this task names stream {s!r} but this write goes to stream "
                    f"'{self.stream}' (option 'stream'); to write to several streams use a super stream"
                )
