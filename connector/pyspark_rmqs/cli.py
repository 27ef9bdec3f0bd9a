"""`rmqs`: look at streams, lag, offsets and messages; move watermarks; create, delete and publish.

Every command that talks to the broker takes the same connection flags (--uri, --endpoints,
--username, --password, --vhost, --tls, --ca-file, --cert-file, --key-file, --trust-all) or their
environment variables (RMQS_URI, RMQS_ENDPOINTS, ..., RMQS_TRUST_ALL); the default is the local
broker on localhost:5552. Exit codes: 0 success, 1 an error, 2 a usage error, 3 lag above --max-lag.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from pyspark_rmqs.cli_common import (
    EXIT_LAG,
    NO_CHECKOUT,
    ConnectionFlags,
    checkout_root,
    confirm,
    connected,
    console,
    err,
    fail,
    print_json,
    target,
)
from pyspark_rmqs.cli_sample import file_records, sample_orders, send_records

__all__ = ["app", "main", "sample_orders", "send_records"]

_HELP = "\n\n".join(" ".join(paragraph.split()) for paragraph in (__doc__ or "").split("\n\n"))
app = typer.Typer(add_completion=True, no_args_is_help=True, help=_HELP)
broker_app = typer.Typer(no_args_is_help=True, help="Install, start and stop the local RabbitMQ 4.0 broker.")
watermark_app = typer.Typer(no_args_is_help=True, help="Show or move a consumer's watermark (stored offset).")
stream_app = typer.Typer(no_args_is_help=True, help="Manage streams and super streams.")
app.add_typer(broker_app, name="broker")
app.add_typer(watermark_app, name="watermark")
app.add_typer(stream_app, name="stream")

StreamOpt = Annotated[str | None, typer.Option("--stream", help="A stream.")]
SuperOpt = Annotated[str | None, typer.Option("--superstream", help="A super stream (all its partitions).")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print JSON on stdout (shapes in docs/cli.md) instead of a table.")
]
ConsumerOpt = Annotated[
    str, typer.Option("--consumer", help="The consumer name whose stored offset is the watermark.")
]
YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Do it without asking (needed when stdin is not a terminal).")
]


def _version() -> str:
    try:
        return version("rmqs")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"rmqs {_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the rmqs version and exit."
        ),
    ] = False,
) -> None:
    pass


def _wm(v: int | None) -> str:
    return "-" if v is None else str(v)


# ------------------------------------------------------------------------------------ reading


@app.command()
@connected
def lag(
    consumer: ConsumerOpt,
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    max_lag: Annotated[
        int | None,
        typer.Option(
            "--max-lag",
            min=0,
            help=f"Exit {EXIT_LAG} when the total lag is above N, 0 at or below it (cron, monitoring).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Per partition: first offset, tail, watermark (stored offset) and lag of a consumer."""
    from pyspark_rmqs.watermarks import watermarks

    w = watermarks(conn.connect(), consumer, **target(stream, superstream))
    over = max_lag is not None and w.total_lag > max_lag
    if as_json:
        print_json({**w.to_dict(), "max_lag": max_lag, "over_max_lag": over})
    else:
        table = Table(title=f"lag of '{consumer}' on {w.target}")
        for col in ("partition", "first", "tail", "watermark", "lag"):
            table.add_column(col, justify="left" if col == "partition" else "right")
        for p in w.partitions:
            table.add_row(p.stream, str(p.first), str(p.tail), _wm(p.stored), str(p.lag))
        table.add_row("total", "", "", "", str(w.total_lag))
        console.print(table)
    if over:
        err.print(f"rmqs: total lag {w.total_lag} of '{consumer}' on {w.target} is above --max-lag {max_lag}")
        raise typer.Exit(EXIT_LAG)


@app.command()
@connected
def offsets(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Stream statistics per partition: first and committed chunk ids, first offset, tail."""
    from pyspark_rmqs.broker.client import BrokerClient

    client = BrokerClient(conn.connect())
    t = target(stream, superstream)
    if "superstream" in t:
        names = client.partitions(t["superstream"])
    elif client.stream_exists(t["stream"]):
        names = [t["stream"]]
    else:
        fail(f"stream '{t['stream']}' does not exist")
    rows = []
    for s in names:
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


@app.command()
@connected
def peek(
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
    from pyspark_rmqs.cli_peek import peek as do_peek

    t = target(stream, superstream)
    result = do_peek(conn.connect(), start, count, stream=t.get("stream"), superstream=t.get("superstream"))
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


# ---------------------------------------------------------------------------------- watermarks


@watermark_app.command("show")
@connected
def watermark_show(
    consumer: ConsumerOpt,
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Per partition: the watermark, where the next run starts, lag, and any pending run plan."""
    from pyspark_rmqs.cli_watermark import show

    data = show(conn.connect(), consumer, **target(stream, superstream))
    if as_json:
        print_json(data)
        return
    table = Table(title=f"watermark of '{consumer}' on {data['target']}")
    for col in ("partition", "first", "tail", "watermark", "next", "lag", "pending plan"):
        table.add_column(col, justify="left" if col in ("partition", "pending plan") else "right")
    for p in data["partitions"]:
        plan = p["pending_plan"]
        table.add_row(
            p["stream"],
            str(p["first"]),
            str(p["tail"]),
            _wm(p["watermark"]),
            str(p["next_offset"]),
            str(p["lag"]),
            f"[{plan['start']}, {plan['end']})" if plan else "-",
        )
    table.add_row("total", "", "", "", "", str(data["total_lag"]), "")
    console.print(table)
    if any(p["pending_plan"] for p in data["partitions"]):
        console.print("A pending plan is a run that planned but did not finish: its retry reads exactly it.")


@watermark_app.command("set")
@connected
def watermark_set(
    consumer: ConsumerOpt,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="Where the next run starts: earliest, latest, an offset, an ISO-8601 datetime "
            '(UTC if no zone) or offsets JSON like {"orders-0": 1200} (only the partitions named).',
        ),
    ],
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show the current and new watermark per partition; change nothing."),
    ] = False,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Move a consumer's watermark (backwards too, shown as such); the watermark is start - 1."""
    from pyspark_rmqs.cli_watermark import apply_move, plan_move

    c = conn.connect()
    move = plan_move(c, consumer, to, **target(stream, superstream))
    changed = move.changed
    if not as_json:
        _print_move(move, dry_run)
    if dry_run or not changed:
        if as_json:
            print_json(move.to_dict(dry_run=dry_run, applied=False))
        elif dry_run:
            console.print("dry run: nothing was changed")
        else:
            console.print("nothing to change")
        return
    back = f" ({len(move.backwards)} partition(s) BACKWARDS: their messages will be read again)"
    confirm(
        f"Move the watermark of '{consumer}' on {len(changed)} partition(s) of {move.target}"
        f"{back if move.backwards else ''}?",
        yes,
    )
    apply_move(c, move)
    if as_json:
        print_json(move.to_dict(dry_run=False, applied=True))
    else:
        console.print(f"watermark of '{consumer}' moved on {len(changed)} partition(s) of {move.target}")


def _print_move(move: Any, dry_run: bool) -> None:
    title = f"{'dry run: ' if dry_run else ''}watermark of '{move.consumer}' on {move.target} -> {move.to}"
    table = Table(title=title)
    for col in ("partition", "watermark", "new", "change", "lag", "lag after"):
        table.add_column(col, justify="left" if col in ("partition", "change") else "right")
    notes: list[str] = []
    for p in move.partitions:
        change = p.change.upper() if p.change == "backward" else p.change
        table.add_row(p.stream, _wm(p.current), _wm(p.new), change, str(p.lag_before), str(p.lag_after))
        if p.note:
            notes.append(f"{p.stream}: {p.note}")
        if p.pending_plan and p.change != "unchanged":
            start, end = p.pending_plan
            notes.append(
                f"{p.stream}: pending plan [{start}, {end}) dropped (a failed run will not retry it)"
            )
        if p.change == "backward":
            notes.append(f"{p.stream}: BACKWARD by {p.current - p.new}: those messages will be read again")
    before = sum(p.lag_before for p in move.partitions)
    after = sum(p.lag_after for p in move.partitions)
    table.add_row("total", "", "", "", str(before), str(after))
    console.print(table)
    for note in notes:
        console.print(note, markup=False, highlight=False)


# ------------------------------------------------------------------------------------ writing


@app.command()
@connected
def create(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="Partitions of a super stream.")] = 3,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Create a stream, or a super stream with N partitions (nothing happens if it exists)."""
    from pyspark_rmqs.broker.client import BrokerClient

    client = BrokerClient(conn.connect())
    t = target(stream, superstream)
    if "superstream" in t:
        client.create_super_stream(t["superstream"], partitions)
        parts = client.partitions(t["superstream"])
    else:
        client.create_stream(t["stream"])
        parts = [t["stream"]]
    name = t.get("superstream") or t["stream"]
    if as_json:
        print_json({"target": name, "superstream": "superstream" in t, "partitions": parts})
    elif "superstream" in t:
        console.print(f"super stream {name}: {', '.join(parts)}")
    else:
        console.print(f"stream {name} ready")


@stream_app.command("delete")
@connected
def stream_delete(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    *,
    conn: ConnectionFlags,
) -> None:
    """Delete a stream, or a super stream with all its partitions (asks first; --yes skips asking)."""
    from pyspark_rmqs.broker.client import BrokerClient
    from pyspark_rmqs.errors import StreamNotFoundError

    client = BrokerClient(conn.connect())
    t = target(stream, superstream)
    name = t.get("superstream") or t["stream"]
    if "superstream" in t:
        parts = client.partitions(name)
    elif client.stream_exists(name):
        parts = [name]
    else:
        raise StreamNotFoundError(f"stream '{name}' does not exist")
    messages = sum(client.tail(p) - client.first_offset(p) for p in parts)
    what = (
        f"super stream '{name}' and its partitions {', '.join(parts)}"
        if "superstream" in t
        else f"stream '{name}'"
    )
    confirm(f"Delete {what} (about {messages} messages)? This cannot be undone.", yes)
    if "superstream" in t:
        client.delete_super_stream(name)
    else:
        client.delete_stream(name)
    if as_json:
        print_json({"target": name, "superstream": "superstream" in t, "deleted": parts})
    else:
        console.print(f"deleted {what}")


@app.command()
@connected
def publish(
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
    name = t.get("superstream") or t["stream"]
    started = time.monotonic()
    sent = 0
    with (
        StreamProducer(c, name, superstream="superstream" in t, settings=WriteSettings()) as producer,
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
        task = progress.add_task("publish", total=total, target=name, rate="-")
        batch: list[dict[str, Any]] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= 5000:
                sent += send_records(producer, batch, key)
                batch = []
                progress.update(task, completed=sent, rate=f"{sent / (time.monotonic() - started):,.0f}")
        if batch:
            sent += send_records(producer, batch, key)
        producer.flush()
        progress.update(task, completed=sent, rate=f"{sent / (time.monotonic() - started):,.0f}")
    secs = max(time.monotonic() - started, 1e-6)
    if as_json:
        print_json({"target": name, "published": sent, "seconds": round(secs, 3), "rate": round(sent / secs)})
    else:
        console.print(f"published {sent:,} messages to {name} in {secs:.1f} s ({sent / secs:,.0f} msg/s)")


# ----------------------------------------------------------------------------- broker and demo


def _broker_script() -> Path:
    root = checkout_root()
    if root is None:
        fail(f"rmqs broker: {NO_CHECKOUT}")
    return root / "scripts" / "broker.sh"


def _broker(action: str) -> None:
    rc = subprocess.call(["bash", str(_broker_script()), action])
    raise typer.Exit(rc)


@broker_app.command("up")
def broker_up() -> None:
    """Install (once) and start a local RabbitMQ 4.0 on loopback (stream 5552, management 15672)."""
    _broker("up")


@broker_app.command("down")
def broker_down() -> None:
    """Stop the local broker (only the processes this project started)."""
    _broker("down")


@broker_app.command("status")
def broker_status() -> None:
    """Is the local broker running? (exit code 3 when it is not)"""
    proc = subprocess.run(["bash", str(_broker_script()), "status"], capture_output=True, text=True)
    typer.echo((proc.stdout + proc.stderr).strip())
    raise typer.Exit(proc.returncode)


@app.command()
def demo(
    uri: Annotated[
        str | None,
        typer.Option(
            "--uri", envvar="RMQS_URI", show_default=False, help="Broker URI (default: the local broker)."
        ),
    ] = None,
) -> None:
    """Run the end-to-end demo from a checkout (what `make demo` runs once the environment is set up)."""
    root = checkout_root()
    if root is None or not (root / "dags").is_dir():
        fail(f"rmqs demo: {NO_CHECKOUT}")
    env = dict(os.environ)
    if uri:
        env["RMQS_URI"] = uri
    # The demo runs in its own process: demo uses the CLI's pieces, never the reverse.
    raise typer.Exit(subprocess.call([sys.executable, "-m", "pyspark_rmqs.demo"], cwd=root, env=env))


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    app()


if __name__ == "__main__":
    main()
