"""Source and sink schemas: the Arrow schema the reader produces and its Spark DDL twin.

Both are derived from one table of columns so they cannot drift. No pyspark import: Spark's
`DataSource.schema()` accepts the DDL string. No pyarrow import at module level either: the option
models import the column names from here, and Airflow's scheduler and triggerer (which parse
options) must not load pyarrow; the Arrow types (`TS`, `PROPERTIES_TYPE`, `STRING_MAP`,
`PROPERTIES_FIELDS`, `FIXED_COLUMNS`, `OPTIONAL_COLUMNS`) are built on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

METADATA_FIELDS: tuple[str, ...] = (
    "properties",
    "application_properties",
    "message_annotations",
    "creation_time",
    "routing_key",
)

# (name, Arrow type name, Spark DDL type): "ts" is a UTC microsecond timestamp.
_PROPERTY_SPECS: tuple[tuple[str, str, str], ...] = (
    ("message_id", "string", "STRING"),
    ("user_id", "binary", "BINARY"),
    ("to", "string", "STRING"),
    ("subject", "string", "STRING"),
    ("reply_to", "string", "STRING"),
    ("correlation_id", "string", "STRING"),
    ("content_type", "string", "STRING"),
    ("content_encoding", "string", "STRING"),
    ("absolute_expiry_time", "ts", "TIMESTAMP"),
    ("creation_time", "ts", "TIMESTAMP"),
    ("group_id", "string", "STRING"),
    ("group_sequence", "int64", "BIGINT"),
    ("reply_to_group_id", "string", "STRING"),
)
PROPERTY_NAMES: tuple[str, ...] = tuple(n for n, _, _ in _PROPERTY_SPECS)
_FIXED_SPECS: tuple[tuple[str, str, str], ...] = (
    ("value", "binary", "BINARY"),
    ("stream", "string", "STRING"),
    ("offset", "int64", "BIGINT"),
    ("chunk_timestamp", "ts", "TIMESTAMP"),
)
_PROPS_DDL = "STRUCT<" + ", ".join(f"`{n}`: {d}" for n, _, d in _PROPERTY_SPECS) + ">"
_OPTIONAL_SPECS: dict[str, tuple[str, str]] = {
    "properties": ("properties", _PROPS_DDL),
    "application_properties": ("string_map", "MAP<STRING, STRING>"),
    "message_annotations": ("string_map", "MAP<STRING, STRING>"),
    "creation_time": ("ts", "TIMESTAMP"),
    "routing_key": ("string", "STRING"),
}


@functools.cache
def _arrow() -> dict[str, Any]:
    """The Arrow twins of the tables above (imports pyarrow, once)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    types: dict[str, Any] = {"string": pa.string(), "binary": pa.binary(), "int64": pa.int64(), "ts": ts}
    props_fields = tuple((n, types[t], d) for n, t, d in _PROPERTY_SPECS)
    types["properties"] = pa.struct([pa.field(n, t, nullable=True) for n, t, _ in props_fields])
    types["string_map"] = pa.map_(pa.string(), pa.string())
    return {
        "TS": ts,
        "PROPERTIES_FIELDS": props_fields,
        "PROPERTIES_TYPE": types["properties"],
        "STRING_MAP": types["string_map"],
        "FIXED_COLUMNS": tuple((n, types[t], d) for n, t, d in _FIXED_SPECS),
        "OPTIONAL_COLUMNS": {k: (types[t], d) for k, (t, d) in _OPTIONAL_SPECS.items()},
    }


_ARROW_NAMES = frozenset(
    ("TS", "PROPERTIES_FIELDS", "PROPERTIES_TYPE", "STRING_MAP", "FIXED_COLUMNS", "OPTIONAL_COLUMNS")
)


def __getattr__(name: str) -> Any:  # PEP 562: TS, PROPERTIES_TYPE, ... built when first imported
    if name in _ARROW_NAMES:  # only these: the import system probes others (`__path__`)
        return _arrow()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def source_columns(metadata_fields: Sequence[str]) -> list[tuple[str, pa.DataType, str]]:
    """Fixed columns, then the requested optional ones in canonical order."""
    arrow = _arrow()
    wanted = set(metadata_fields)
    cols = list(arrow["FIXED_COLUMNS"])
    cols += [(n, *arrow["OPTIONAL_COLUMNS"][n]) for n in METADATA_FIELDS if n in wanted]
    return cols


def source_arrow_schema(metadata_fields: Sequence[str]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field(n, t, nullable=True) for n, t, _ in source_columns(metadata_fields)])


def source_ddl(metadata_fields: Sequence[str]) -> str:
    """The Spark DDL of the source schema (no pyarrow needed)."""
    wanted = set(metadata_fields)
    cols = [(n, d) for n, _, d in _FIXED_SPECS]
    cols += [(n, _OPTIONAL_SPECS[n][1]) for n in METADATA_FIELDS if n in wanted]
    return ", ".join(f"`{n}` {d}" for n, d in cols)


SINK_COLUMNS: tuple[str, ...] = (
    "value",
    "stream",
    "routing_key",
    "properties",
    "application_properties",
    "message_annotations",
    "creation_time",
)
