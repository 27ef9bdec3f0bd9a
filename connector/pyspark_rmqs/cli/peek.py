"""`rmqs peek`: show a few messages of a stream or of each partition of a super stream.

The command (`peek_command`, registered by cli.py) prints what `peek` returns as data.

Reads with the connector's own `RangeReader` (via `read_range`), so what peek shows is what Spark
and the Arrow operators read: stream, offset, chunk timestamp, AMQP properties, application
properties and the body (UTF-8 text when it decodes, else hex).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

import typer

from pyspark_rmqs.cli.common import (
    ConnectionFlags,
    JsonOpt,
    StreamOpt,
    SuperOpt,
    connected,
    console,
    err,
    print_json,
    target,
)
from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.target import Target

FROM_FORMS = "earliest, latest (the last N messages), an offset (e.g. 1200) or an ISO-8601 datetime"


@dataclass
class Peeked:
    target: str
    superstream: bool
    start: str
    count: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "superstream": self.superstream,
            "from": self.start,
            "count": self.count,
            "messages": self.messages,
            "notes": self.notes,
        }


@connected
def peek_command(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="earliest, latest (the last N messages), an offset or an ISO-8601 datetime (UTC if no zone)"
            ".",
        ),
    ] = "earliest",
    count: Annotated[
        int, typer.Option("--count", "-n", min=1, max=10_000, help="At most N messages per partition stream.")
    ] = 10,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Show messages: stream, offset, chunk timestamp, properties, application properties, body."""
    result = peek(conn.connect(), target(stream, superstream), start, count)
    if as_json:
        print_json(result.to_dict())
    else:
        for m in result.messages:
            console.print(
                f"[bold]{m['stream']}[/] offset [bold]{m['offset']}[/]  chunk {m['chunk_timestamp']}"
            )
            if m["properties"]:
                console.print("  properties: " + ", ".join(f"{k}={v}" for k, v in m["properties"].items()))
            if m["application_properties"]:
                shown = ", ".join(f"{k}={v}" for k, v in m["application_properties"].items())
                console.print(f"  application properties: {shown}")
            label = "body" if m["body_encoding"] == "utf-8" else "body (hex)"
            console.print(f"  {label}: {m['body']}", markup=False, highlight=False)
    for note in result.notes:
        err.print(f"rmqs: {note}", markup=False, highlight=False)


def peek(conn: Any, t: Target, start: str, count: int, *, timeout_s: float = 30.0) -> Peeked:
    """Up to `count` messages per partition stream from `start` (never past the tail: no waiting)."""
    from pyspark_rmqs.cli.watermark import parse_datetime
    from pyspark_rmqs.runs import steps
    from pyspark_rmqs.runs.watermarks import watermarks

    w = watermarks(conn, "", **t.kw())
    value = start.strip()
    starts: dict[str, int]
    notes: list[str] = []
    if value == "latest":
        starts = {p.stream: max(p.first, p.tail - count) for p in w.partitions}
    elif value == "earliest":
        starts = {p.stream: p.first for p in w.partitions}
    elif re.fullmatch(r"\d+", value):
        starts = {}
        for p in w.partitions:
            starts[p.stream] = max(int(value), p.first)
            if int(value) < p.first:
                notes.append(
                    f"'{p.stream}': offset {value} is gone (retention); from the first offset {p.first}"
                )
    else:
        when = parse_datetime(value)
        if when is None:
            raise ConfigurationError(f"--from must be {FROM_FORMS}; got {start!r}")
        plan = steps.plan_read(conn, **t.kw(), start=when, persist=False, fail_on_data_loss=False)
        starts = dict(plan.start)
    out = Peeked(w.target, w.superstream, start, count, notes=notes)
    for p in w.partitions:
        s = starts[p.stream]
        if p.tail <= p.first:
            out.notes.append(f"'{p.stream}' is empty (no messages)")
            continue
        if s >= p.tail:
            out.notes.append(f"'{p.stream}': no messages from offset {s} (the tail is {p.tail})")
            continue
        found = _read(conn, p.stream, s, p.tail, count, timeout_s)
        if not found:
            out.notes.append(f"'{p.stream}': no messages in [{s}, {p.tail})")
        out.messages += found
    return out


def _read(
    conn: Any, stream: str, start: int, tail: int, count: int, timeout_s: float
) -> list[dict[str, Any]]:
    """Up to `count` messages from `start`; offsets taken by tracking entries are skipped over."""
    from pyspark_rmqs.broker.reader import ReadSettings, read_range

    settings = ReadSettings(
        metadata_fields=("properties", "application_properties"),
        poll_timeout_ms=int(timeout_s * 1000),
        max_wait_ms=int(timeout_s * 4000),
        batch_rows=max(1, min(count, 8192)),
    )
    rows: list[dict[str, Any]] = []
    pos, step = start, count
    while len(rows) < count and pos < tail:
        end = min(tail, pos + step)
        rows += read_range(conn, stream, pos, end, settings).to_pylist()
        pos, step = end, step * 2
    return [message_dict(r) for r in rows[:count]]


def message_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    """One source row as JSON-friendly data: body as text when it is UTF-8, else hex."""
    body = row.get("value") or b""
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = body.hex(), "hex"
    props = {k: _plain(v) for k, v in (row.get("properties") or {}).items() if v is not None}
    app_props = dict(row.get("application_properties") or [])
    return {
        "stream": row["stream"],
        "offset": row["offset"],
        "chunk_timestamp": _plain(row.get("chunk_timestamp")),
        "properties": props,
        "application_properties": app_props,
        "body": text,
        "body_encoding": encoding,
    }


def _plain(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v.hex()
    return v
