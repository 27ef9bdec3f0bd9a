"""`rmqs offsets`, `rmqs create`, `rmqs stream delete`, `rmqs publish`: the streams themselves.

What a stream holds (its statistics per partition), making and removing streams and super streams,
and filling them with sample order events or a file's records (`cli_sample` turns records into
messages). Nothing here knows a consumer name: watermarks are `cli_watermark`'s. The commands are
registered by cli.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from pyspark_rmqs.cli.common import (
    ConnectionFlags,
    JsonOpt,
    StreamOpt,
    SuperOpt,
    YesOpt,
    confirm,
    connected,
    console,
    err,
    print_json,
    target,
)
from pyspark_rmqs.cli.sample import file_records, sample_orders, send_records

PUBLISH_BATCH = 5000  # records handed to the producer at a time (and between progress updates)


@connected
def offsets_command(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Stream statistics per partition: first and committed chunk ids, first offset, tail."""
    from pyspark_rmqs.broker.client import BrokerClient

    client = BrokerClient(conn.connect())
    rows = []
    for s in target(stream, superstream).streams(client):
        st = client.stats(s)
        rows.append(
            {
                "stream": s,
                "first_chunk_id": st.first_chunk_id,
                "committed_chunk_id": st.committed_chunk_id,
                "first_offset": st.first_offset,
                "tail": client.tail(s),
            }
        )
    if as_json:
        print_json(rows)
        return
    table = Table(title="stream offsets")
    for col in rows[0] if rows else ("stream",):
        table.add_column(col, justify="left" if col == "stream" else "right")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    console.print(table)


@connected
def create_command(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="Partitions of a super stream.")] = 3,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Create a stream, or a super stream with N partitions (nothing happens if it exists).

    `--stream rmqs.runs` creates the run records' stream with its retention (newest 1 GB), for an
    administrator preparing a virtual host whose teams may not create streams.
    """
    from pyspark_rmqs.broker.client import BrokerClient

    client = BrokerClient(conn.connect())
    t = target(stream, superstream)
    if t.is_super:
        client.create_super_stream(t.name, partitions)
    else:
        from pyspark_rmqs.runs.record import RUNS_STREAM, RUNS_STREAM_ARGUMENTS

        # The run records' stream gets the retention a run would give it (docs/permissions.md).
        client.create_stream(t.name, RUNS_STREAM_ARGUMENTS if t.name == RUNS_STREAM else None)
    parts = t.streams(client)
    if as_json:
        print_json({"target": t.name, "superstream": t.is_super, "partitions": parts})
    elif t.is_super:
        console.print(f"super stream {t.name}: {', '.join(parts)}")
    else:
        console.print(f"stream {t.name} ready")


@connected
def delete_command(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Delete a stream, or a super stream with all its partitions (asks first; --yes skips asking)."""
    from pyspark_rmqs.broker.client import BrokerClient

    client = BrokerClient(conn.connect())
    t = target(stream, superstream)
    parts = t.streams(client)
    messages = sum(client.tail(p) - client.first_offset(p) for p in parts)
    what = f"{t.describe()} and its partitions {', '.join(parts)}" if t.is_super else t.describe()
    confirm(f"Delete {what} (about {messages} messages)? This cannot be undone.", yes)
    if t.is_super:
        client.delete_super_stream(t.name)
    else:
        client.delete_stream(t.name)
    if as_json:
        print_json({"target": t.name, "superstream": t.is_super, "deleted": parts})
    else:
        console.print(f"deleted {what}")


@connected
def publish_command(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    count: Annotated[int, typer.Option("--count", min=1, help="Sample order events to publish.")] = 10_000,
    file: Annotated[
        Path | None, typer.Option("--file", exists=True, help="JSON-lines or Parquet file to publish.")
    ] = None,
    key: Annotated[
        str, typer.Option("--key", help="Field used as routing key for a super stream.")
    ] = "customer",
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Publish sample order events (or a file's records) as JSON messages with properties."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings

    t = target(stream, superstream)
    records = file_records(file) if file else sample_orders(count)
    total = None if file else count
    c = conn.connect()
    started = time.monotonic()
    sent = 0
    with (
        StreamProducer(c, t.name, superstream=t.is_super, settings=WriteSettings()) as producer,
        Progress(
            TextColumn("publishing to [bold]{task.fields[target]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} msg/s"),
            TimeElapsedColumn(),
            console=err,
            disable=as_json,
        ) as progress,
    ):
        task = progress.add_task("publish", total=total, target=t.name, rate="-")
        batch: list[dict[str, Any]] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= PUBLISH_BATCH:
                sent += send_records(producer, batch, key)
                batch = []
                progress.update(task, completed=sent, rate=f"{sent / (time.monotonic() - started):,.0f}")
        if batch:
            sent += send_records(producer, batch, key)
        producer.flush()
        progress.update(task, completed=sent, rate=f"{sent / (time.monotonic() - started):,.0f}")
    secs = max(time.monotonic() - started, 1e-6)
    if as_json:
        print_json(
            {"target": t.name, "published": sent, "seconds": round(secs, 3), "rate": round(sent / secs)}
        )
    else:
        console.print(f"published {sent:,} messages to {t.name} in {secs:.1f} s ({sent / secs:,.0f} msg/s)")
