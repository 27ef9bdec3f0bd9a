"""The end-to-end demo behind `make demo` / `rmqs demo`.

1. a super stream `orders` with 3 partitions on the local broker;
2. 100,000 sample order events published (with properties and application properties);
3. the example Airflow DAG `rmqs_ingest` run with `airflow dags test` (SQLite, no scheduler): it
   reads what is new into Parquet under demo-output/ and advances its watermark;
4. the example Dagster asset `orders` materialized (its own consumer name and watermark);
5. a summary: rows per partition, offset ranges, lag, where the output is, what to try next.

A second run publishes 100,000 more and both pipelines read only those.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from pyspark_rmqs.runs.watermarks import Watermarks

console = Console()

SUPERSTREAM = os.environ.get("RMQS_DEMO_SUPERSTREAM", "orders")
MESSAGES = int(os.environ.get("RMQS_DEMO_MESSAGES", "100000"))
AIRFLOW_CONSUMER = "rmqs-demo-ingest"
DAGSTER_CONSUMER = "dagster-orders"


def _step(title: str) -> float:
    console.rule(f"[bold cyan]{title}")
    return time.monotonic()


def _done(t0: float, what: str) -> None:
    console.print(f"[green]✓[/] {what} ({time.monotonic() - t0:.1f} s)")


def _run(cmd: list[str], env: dict[str, str], log: Path, what: str) -> None:
    """Run a command with all its output (Airflow and Dagster log at DEBUG) appended to `log`.

    The terminal gets one progress line; on failure, the last lines of the log (whole lines) and
    the log's path, then the demo stops.
    """
    console.print(f"  {what} [dim](output in {_shown(log)})[/]", soft_wrap=True)
    with log.open("a") as f:
        f.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        console.print("\n".join(tail), markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(f"demo: '{' '.join(cmd[:4])} ...' failed (exit {rc}); the whole output is in {log}")


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def run_demo(root: Path | None = None) -> int:
    from pyspark_rmqs.cli.common import checkout_root, no_checkout

    root = root or checkout_root()
    if root is None or not (root / "dags").is_dir():
        console.print(f"[bold red]rmqs:[/] {no_checkout('demo')}", soft_wrap=True)
        return 1
    started = time.monotonic()
    from pyspark_rmqs.broker.client import BrokerClient
    from pyspark_rmqs.cli.sample import sample_orders, send_records
    from pyspark_rmqs.options import parse_connection_options
    from pyspark_rmqs.runs.watermarks import watermarks

    uri = os.environ.get("RMQS_URI", "rabbitmq-stream://guest:guest@localhost:5552/%2F")
    conn = parse_connection_options({"uris": uri})
    client = BrokerClient(conn)
    venv_bin = Path(sys.executable).parent

    t0 = _step(f"super stream '{SUPERSTREAM}'")
    client.create_super_stream(SUPERSTREAM, 3)
    parts = client.partitions(SUPERSTREAM)
    _done(t0, f"partitions: {', '.join(parts)}")

    before = {c: watermarks(conn, c, superstream=SUPERSTREAM) for c in (AIRFLOW_CONSUMER, DAGSTER_CONSUMER)}

    t0 = _step(f"publish {MESSAGES:,} sample order events")
    from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings

    offset = sum(p.tail for p in before[AIRFLOW_CONSUMER].partitions)
    events = list(sample_orders(MESSAGES + offset))[offset:]
    with (
        StreamProducer(conn, SUPERSTREAM, superstream=True, settings=WriteSettings()) as producer,
        Progress(
            TextColumn("  publishing"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        ) as progress,
    ):
        task = progress.add_task("publish", total=len(events))
        for i in range(0, len(events), 10_000):
            send_records(producer, events[i : i + 10_000], "customer")
            progress.update(task, completed=min(i + 10_000, len(events)))
        producer.flush()
    _done(t0, f"published {len(events):,} messages ({len(events) / (time.monotonic() - t0):,.0f} msg/s)")

    env = dict(os.environ)
    demo_home = root / ".demo"
    env.update(
        {
            "AIRFLOW_HOME": str(demo_home / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT": uri,
            "RMQS_URI": uri,
            "RMQS_DEMO_SUPERSTREAM": SUPERSTREAM,
            "RMQS_DEMO_OUTPUT": str(root / "demo-output" / "orders"),
            "RMQS_DEMO_DEFERRABLE": "false",
            "RMQS_DEMO_POKE_INTERVAL": "1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "DAGSTER_HOME": str(demo_home / "dagster"),
        }
    )
    (demo_home / "dagster").mkdir(parents=True, exist_ok=True)
    log = demo_home / "demo.log"
    log.write_text(f"rmqs demo {time.strftime('%Y-%m-%d %H:%M:%S')}: Airflow and Dagster output\n")

    t0 = _step("Airflow: airflow dags test rmqs_ingest")
    airflow = str(venv_bin / "airflow")
    if not (demo_home / "airflow" / "airflow.db").exists():
        _run(
            [airflow, "db", "migrate"], env, log, "first run: creating the Airflow metadata database (SQLite)"
        )
    _run(
        [airflow, "dags", "test", "rmqs_ingest"],
        env,
        log,
        "running the DAG: wait for data, read, store watermark",
    )
    _done(t0, "rmqs_ingest finished")

    t0 = _step("Dagster: materialize the asset 'orders'")
    dagster = shutil.which("dagster", path=str(venv_bin)) or "dagster"
    env["RMQS_DEMO_OUTPUT"] = str(root / "demo-output" / "dagster" / "orders")
    _run(
        [dagster, "asset", "materialize", "-m", "dagster_rmqs.examples.definitions", "--select", "orders"],
        env,
        log,
        "materializing: read what is new, write Parquet, store watermark",
    )
    _done(t0, "orders materialized")

    _summary(conn, before, root, log)
    console.print(f"\n[bold green]demo finished in {time.monotonic() - started:.0f} s[/]")
    return 0


def _summary(conn: Any, before: Mapping[str, Watermarks], root: Path, log: Path) -> None:
    from pyspark_rmqs.runs.watermarks import watermarks

    console.rule("[bold cyan]summary")
    for consumer, out in (
        (AIRFLOW_CONSUMER, root / "demo-output" / "orders"),
        (DAGSTER_CONSUMER, root / "demo-output" / "dagster" / "orders"),
    ):
        prev = before[consumer]
        now = watermarks(conn, consumer, superstream=SUPERSTREAM)
        table = Table(title=f"consumer '{consumer}' → {out}")
        for col in ("partition", "read this run", "rows", "tail", "lag now"):
            table.add_column(col, justify="left" if col in ("partition", "read this run") else "right")
        total = 0
        for p0, p1 in zip(prev.partitions, now.partitions, strict=True):
            start = p0.next_offset
            end = (p1.stored + 1) if p1.stored is not None else start
            rows = _rows(out, p1.stream, start, end)
            total += rows
            table.add_row(p1.stream, f"[{start}, {end})", f"{rows:,}", str(p1.tail), str(p1.lag))
        table.add_row("[bold]total", "", f"[bold]{total:,}", "", f"[bold]{now.total_lag}")
        console.print(table)
    console.print(f"\nAirflow and Dagster output (debug logs included): [bold]{_shown(log)}[/]")
    console.print("Next:")
    for line in (
        ".venv/bin/rmqs lag --superstream orders --consumer rmqs-demo-ingest",
        ".venv/bin/rmqs peek --superstream orders --from latest --count 2",
        ".venv/bin/rmqs watermark show --superstream orders --consumer rmqs-demo-ingest",
        ".venv/bin/rmqs publish --superstream orders --count 5000   (then make demo again)",
        "make test   make docs   (the CLI reference is docs/cli.md)",
    ):
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


def _rows(out: Path, stream: str, start: int, end: int) -> int:
    """Rows of `stream` with offsets in [start, end) in the Parquet output (pyarrow, no Spark)."""
    if end <= start or not out.exists():
        return 0
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet").to_table(columns=["stream", "offset"])
    mask = pc.and_(
        pc.equal(table["stream"], stream),
        pc.and_(pc.greater_equal(table["offset"], start), pc.less(table["offset"], end)),
    )
    return int(pc.sum(mask.cast("int64")).as_py() or 0)


if __name__ == "__main__":
    raise SystemExit(run_demo())
