"""Source and sink schemas: the Arrow schema the reader produces and its Spark DDL twin.

Both are derived from one table of columns so they cannot drift. No pyspark import: Spark's
`DataSource.schema()` accepts the DDL string.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

METADATA_FIELDS: tuple[str, ...] = (
    "properties",
    "application_properties",
    "message_annotations",
    "creation_time",
    "routing_key",
)

TS = pa.timestamp("us", tz="UTC")

PROPERTIES_FIELDS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("message_id", pa.string(), "STRING"),
    ("user_id", pa.binary(), "BINARY"),
    ("to", pa.string(), "STRING"),
    ("subject", pa.string(), "STRING"),
    ("reply_to", pa.string(), "STRING"),
    ("correlation_id", pa.string(), "STRING"),
    ("content_type", pa.string(), "STRING"),
    ("content_encoding", pa.string(), "STRING"),
    ("absolute_expiry_time", TS, "TIMESTAMP"),
    ("creation_time", TS, "TIMESTAMP"),
    ("group_id", pa.string(), "STRING"),
    ("group_sequence", pa.int64(), "BIGINT"),
    ("reply_to_group_id", pa.string(), "STRING"),
)
PROPERTY_NAMES: tuple[str, ...] = tuple(n for n, _, _ in PROPERTIES_FIELDS)
PROPERTIES_TYPE = pa.struct([pa.field(n, t, nullable=True) for n, t, _ in PROPERTIES_FIELDS])
STRING_MAP = pa.map_(pa.string(), pa.string())

FIXED_COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("value", pa.binary(), "BINARY"),
    ("stream", pa.string(), "STRING"),
    ("offset", pa.int64(), "BIGINT"),
    ("chunk_timestamp", TS, "TIMESTAMP"),
)
_PROPS_DDL = "STRUCT<" + ", ".join(f"`{n}`: {d}" for n, _, d in PROPERTIES_FIELDS) + ">"
OPTIONAL_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "properties": (PROPERTIES_TYPE, _PROPS_DDL),
    "application_properties": (STRING_MAP, "MAP<STRING, STRING>"),
    "message_annotations": (STRING_MAP, "MAP<STRING, STRING>"),
    "creation_time": (TS, "TIMESTAMP"),
    "routing_key": (pa.string(), "STRING"),
}


def source_columns(metadata_fields: Sequence[str]) -> list[tuple[str, pa.DataType, str]]:
    """Fixed columns, then the requested optional ones in canonical order."""
    wanted = set(metadata_fields)
    cols = list(FIXED_COLUMNS)
    cols += [(n, *OPTIONAL_COLUMNS[n]) for n in METADATA_FIELDS if n in wanted]
    return cols


def source_arrow_schema(metadata_fields: Sequence[str]) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=True) for n, t, _ in source_columns(metadata_fields)])


def source_ddl(metadata_fields: Sequence[str]) -> str:
    return ", ".join(f"`{n}` {d}" for n, _, d in source_columns(metadata_fields))


SINK_COLUMNS: tuple[str, ...] = (
    "value",
    "stream",
    "routing_key",
    "properties",
    "application_properties",
    "message_annotations",
    "creation_time",
)
