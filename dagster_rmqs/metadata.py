"""Materialization metadata under Dagster's standard keys, from a `jobs.RunSummary`.

`dagster/row_count`, `dagster/column_schema` (the source columns read), `dagster/uri` (where the
rows went) are what Dagster's catalog shows and what other integrations emit; the offset ranges are
a table (one row per partition stream), the consumer lag after the run an int. No secrets: the
summary holds none, and the stream URI carries no credentials. No pyarrow: the column schema comes
from the source's Spark DDL, so a code server loading definitions stays light.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from pyspark_rmqs.core.schema import METADATA_FIELDS, source_ddl
from pyspark_rmqs.jobs import RunSummary

ROW_COUNT = "dagster/row_count"
COLUMN_SCHEMA = "dagster/column_schema"
URI = "dagster/uri"
OFFSET_RANGES = "offset_ranges"

_RANGES_SCHEMA = TableSchema(
    columns=[
        TableColumn("stream", "string", description="partition stream"),
        TableColumn("start", "int", description="first offset read (inclusive)"),
        TableColumn("end", "int", description="end offset (exclusive)"),
        TableColumn("offsets", "int", description="end - start"),
    ]
)


def metadata_field_names(metadata_fields: str | None) -> tuple[str, ...]:
    """The optional columns a `metadataFields` value selects (None: all of them, as the source does)."""
    if metadata_fields is None:
        return METADATA_FIELDS
    wanted = {f.strip().lower() for f in metadata_fields.split(",") if f.strip()}
    return tuple(f for f in METADATA_FIELDS if f in wanted)


def _split_top_level(ddl: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in ddl:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur).strip())
    return parts


def column_schema(metadata_fields: str | None = None) -> TableSchema:
    """The source columns (`value`, `stream`, `offset`, `chunk_timestamp`, then metadata fields)."""
    columns = []
    for col in _split_top_level(source_ddl(metadata_field_names(metadata_fields))):
        name, _, kind = col.partition(" ")
        columns.append(TableColumn(name.strip("`"), kind.lower()))
    return TableSchema(columns=columns)


def offset_ranges_table(start: Mapping[str, int], end: Mapping[str, int]) -> MetadataValue:
    """The `[start, end)` range of every partition stream, one table row each."""
    rows = []
    for s in sorted(start):
        a, b = int(start[s]), int(end.get(s, start[s]))
        rows.append(TableRecord({"stream": s, "start": a, "end": b, "offsets": max(0, b - a)}))
    return MetadataValue.table(rows, schema=_RANGES_SCHEMA)


RUN_METRICS = (
    "run_id",
    "pipeline",
    "token",
    "delivery",
    "records_read",
    "records_written",
    "bytes_read",
    "bytes_written",
    "batches",
    "retry_count",
    "fetch_ms",
    "decode_ms",
    "flush_ms",
    "commit_ms",
)


def run_metadata(
    summary: RunSummary,
    *,
    source_uri: str,
    output_uri: str | None,
    metadata_fields: str | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The metadata of one materialization (a watermark run, a range or a time window)."""
    meta: dict[str, Any] = {
        COLUMN_SCHEMA: MetadataValue.table_schema(column_schema(metadata_fields)),
        OFFSET_RANGES: offset_ranges_table(summary.start_offsets, summary.end_offsets),
        "stream_uri": MetadataValue.url(source_uri),
        "start_offsets": MetadataValue.json(dict(summary.start_offsets)),
        "end_offsets": MetadataValue.json(dict(summary.end_offsets)),
        "seconds": MetadataValue.float(float(summary.seconds)),
        "watermark_stored": MetadataValue.bool(summary.watermark_stored),
    }
    if output_uri:
        meta[URI] = MetadataValue.text(output_uri)
    if summary.rows is not None:
        meta[ROW_COUNT] = MetadataValue.int(int(summary.rows))
    for k in ("bytes", "lag_after"):
        v = getattr(summary, k)
        if v is not None:
            meta[k] = MetadataValue.int(int(v))
    # The standard run metrics (DESIGN §9; None where the run cannot measure them).
    metrics = summary.to_dict()
    for k in RUN_METRICS:
        v = metrics.get(k)
        if v is not None:
            meta[f"rmqs/{k}"] = v if isinstance(v, str | int | float | bool) else MetadataValue.json(v)
    for k, v in summary.extra.items():
        meta[k] = MetadataValue.json(v) if isinstance(v, dict | list) else v
    meta.update(extra or {})
    return meta


def combine(summaries: Iterable[RunSummary], layers: list[dict[str, tuple[int, int]]]) -> RunSummary:
    """One summary for the layered reads of an offset-range selection (rows and bytes add up)."""
    done = list(summaries)
    named = {s for layer in layers for s in layer}
    start = {s: min(layer[s][0] for layer in layers if s in layer) for s in named}
    end = {s: max(layer[s][1] for layer in layers if s in layer) for s in named}

    def total(attr: str) -> int | None:
        values = [getattr(s, attr) for s in done]
        return None if any(v is None for v in values) else sum(values)

    return RunSummary(
        done[0].target if done else "",
        start,
        end,
        rows=total("rows"),
        bytes=total("bytes"),
        seconds=round(sum(s.seconds for s in done), 3),
        lag_after=done[-1].lag_after if done else None,
        watermark_stored=False,
    )
