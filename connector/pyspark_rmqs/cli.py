"""`rmqs`: look at streams, lag and offsets, publish sample data, run the local broker and the demo.

Connection settings come from flags or environment variables (RMQS_URI, RMQS_ENDPOINTS,
RMQS_USERNAME, RMQS_PASSWORD, RMQS_VHOST); the default is the local broker on localhost:5552.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pyspark_rmqs.errors import RmqsError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
broker_app = typer.Typer(no_args_is_help=True, help="Install, start and stop the local RabbitMQ 4.0 broker.")
app.add_typer(broker_app, name="broker")
console = Console()
err = Console(stderr=True)

UriOpt = Annotated[
    str | None, typer.Option("--uri", envvar="RMQS_URI", help="rabbitmq-stream://user:pass@host:port/vhost")
]
EndpointsOpt = Annotated[
    str | None, typer.Option("--endpoints", envvar="RMQS_ENDPOINTS", help="host:port[,host:port]")
]
UserOpt = Annotated[str | None, typer.Option("--username", envvar="RMQS_USERNAME")]
PasswordOpt = Annotated[str | None, typer.Option("--password", envvar="RMQS_PASSWORD", show_default=False)]
VhostOpt = Annotated[str | None, typer.Option("--vhost", envvar="RMQS_VHOST")]
StreamOpt = Annotated[str | None, typer.Option("--stream", help="A stream.")]
SuperOpt = Annotated[str | None, typer.Option("--superstream", help="A super stream (all its partitions).")]


def connection(
    uri: str | None, endpoints: str | None, username: str | None, password: str | None, vhost: str | None
) -> Any:
    from pyspark_rmqs.options import parse_connection_options

    opts: dict[str, str] = {}
    if uri:
        opts["uris"] = uri
    else:
        opts["endpoints"] = endpoints or "localhost:5552"
    for k, v in (("username", username), ("password", password), ("vhost", vhost)):
        if v is not None:
            opts[k] = v
    return parse_connection_options(opts)


def _fail(e: Exception) -> None:
    err.print(f"[bold red]rmqs:[/] {e}", soft_wrap=True)
    raise typer.Exit(1)


def _target(stream: str | None, superstream: str | None) -> dict[str, str]:
    if (stream is None) == (superstream is None):
        _fail(ValueError("give exactly one of --stream or --superstream"))
    return {"superstream": superstream} if superstream else {"stream": str(stream)}


@app.command()
def lag(
    consumer: Annotated[
        str, typer.Option("--consumer", help="The consumer name whose stored offset is the watermark.")
    ],
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    uri: UriOpt = None,
    endpoints: EndpointsOpt = None,
    username: UserOpt = None,
    password: PasswordOpt = None,
    vhost: VhostOpt = None,
) -> None:
    """Per partition: first offset, tail, watermark (stored offset) and lag of a consumer."""
    from pyspark_rmqs.watermarks import watermarks

    try:
        w = watermarks(
            connection(uri, endpoints, username, password, vhost), consumer, **_target(stream, superstream)
        )
    except (RmqsError, OSError) as e:
        _fail(e)
    if as_json:
        print(json.dumps(w.to_dict(), indent=2))
        return
    table = Table(title=f"lag of '{consumer}' on {w.target}")
    for col in ("partition", "first", "tail", "watermark", "lag"):
        table.add_column(col, justify="left" if col == "partition" else "right")
    for p in w.partitions:
        table.add_row(
            p.stream, str(p.first), str(p.tail), "-" if p.stored is None else str(p.stored), str(p.lag)
        )
    table.add_row("[bold]total", "", "", "", f"[bold]{w.total_lag}")
    console.print(table)


@app.command()
def offsets(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    uri: UriOpt = None,
    endpoints: EndpointsOpt = None,
    username: UserOpt = None,
    password: PasswordOpt = None,
    vhost: VhostOpt = None,
) -> None:
    """Stream statistics per partition: first and committed chunk ids, first offset, tail."""
    from pyspark_rmqs.broker.client import BrokerClient

    try:
        client = BrokerClient(connection(uri, endpoints, username, password, vhost))
        t = _target(stream, superstream)
        names = client.partitions(t["superstream"]) if "superstream" in t else [t["stream"]]
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
    except (RmqsError, OSError) as e:
        _fail(e)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="stream offsets")
    for col in rows[0] if rows else ("stream",):
        table.add_column(col, justify="left" if col == "stream" else "right")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    console.print(table)


@app.command()
def create(
    stream: StreamOpt = None,
    superstream: SuperOpt = None,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="Partitions of a super stream.")] = 3,
    uri: UriOpt = None,
    endpoints: EndpointsOpt = None,
    username: UserOpt = None,
    password: PasswordOpt = None,
    vhost: VhostOpt = None,
) -> None:
    """Create a stream, or a super stream with N partitions (nothing happens if it exists)."""
    from pyspark_rmqs.broker.client import BrokerClient

    try:
        client = BrokerClient(connection(uri, endpoints, username, password, vhost))
        t = _target(stream, superstream)
        if "superstream" in t:
            client.create_super_stream(t["superstream"], partitions)
            console.print(
                f"super stream [bold]{superstream}[/]: {', '.join(client.partitions(t['superstream']))}"
            )
        else:
            client.create_stream(t["stream"])
            console.print(f"stream [bold]{stream}[/] ready")
    except (RmqsError, OSError) as e:
        _fail(e)


REGIONS = ("eu", "us", "apac")
PRODUCTS = ("keyboard", "monitor", "laptop", "mouse", "headset", "dock")


def sample_orders(count: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    """Deterministic sample order events (the demo's data)."""
    rnd = random.Random(seed)
    for i in range(count):
        customer = f"c{rnd.randrange(5000):04d}"
        yield {
            "order_id": f"o-{i:07d}",
            "customer": customer,
            "product": rnd.choice(PRODUCTS),
            "quantity": rnd.randint(1, 5),
            "amount": round(rnd.uniform(5, 900), 2),
            "currency": "EUR",
            "region": rnd.choice(REGIONS),
        }


def _file_records(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()
    else:
        with path.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


@app.command()
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
    uri: UriOpt = None,
    endpoints: EndpointsOpt = None,
    username: UserOpt = None,
    password: PasswordOpt = None,
    vhost: VhostOpt = None,
) -> None:
    """Publish sample order events (or a file's records) as JSON messages with properties."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings

    t = _target(stream, superstream)
    records = _file_records(file) if file else sample_orders(count)
    total = None if file else count
    try:
        conn = connection(uri, endpoints, username, password, vhost)
        target = t.get("superstream") or t["stream"]
        start = time.monotonic()
        sent = 0
        with (
            StreamProducer(
                conn, target, superstream="superstream" in t, settings=WriteSettings()
            ) as producer,
            Progress(
                TextColumn("publishing to [bold]{task.fields[target]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} msg/s"),
                TimeElapsedColumn(),
                console=err,
            ) as progress,
        ):
            task = progress.add_task("publish", total=total, target=target, rate="-")
            batch: list[dict[str, Any]] = []
            for rec in records:
                batch.append(rec)
                if len(batch) >= 5000:
                    sent += _send(producer, batch, key)
                    batch = []
                    progress.update(task, completed=sent, rate=f"{sent / (time.monotonic() - start):,.0f}")
            if batch:
                sent += _send(producer, batch, key)
            producer.flush()
            progress.update(task, completed=sent, rate=f"{sent / (time.monotonic() - start):,.0f}")
        secs = time.monotonic() - start
        console.print(
            f"published {sent:,} messages to [bold]{target}[/] in {secs:.1f} s ({sent / secs:,.0f} msg/s)"
        )
    except (RmqsError, OSError) as e:
        _fail(e)


def _send(producer: Any, batch: list[dict[str, Any]], key: str) -> int:
    from pyspark_rmqs.codec import encode

    now = datetime.now(UTC)
    msgs = []
    keys = []
    for rec in batch:
        k = str(rec.get(key, ""))
        props = {
            "message_id": str(rec.get("order_id") or uuid.uuid4()),
            "content_type": "application/json",
            "creation_time": now,
        }
        app_props = {"region": str(rec.get("region", "")), "routing_key": k}
        msgs.append(encode(json.dumps(rec, default=str).encode(), props, app_props))
        keys.append(k)
    producer.send(msgs, keys if producer.superstream else None)
    return len(msgs)


def _broker_script() -> Path:
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "scripts" / "broker.sh", here.parent / "_broker.sh"):
        if candidate.exists():
            return candidate
    _fail(FileNotFoundError("scripts/broker.sh not found (run from a checkout of the rmqs repository)"))
    raise AssertionError


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
def demo() -> None:
    """Run the end-to-end demo (what `make demo` runs once the environment is set up)."""
    from pyspark_rmqs.demo import run_demo

    raise typer.Exit(run_demo())


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    app()


if __name__ == "__main__":
    main()
