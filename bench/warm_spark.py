"""Scheduled Spark tasks over a warm Spark Connect server against the Spark-free ones, and where a
Spark task's seconds go.

    .venv/bin/python -m bench.warm_spark [--messages N] [--rounds 3] [--kinds connect,consume,...]

PySpark's bundled Connect server (local[2]) is started once, as docs/operations.md advises for
scheduled reads; then each round runs every kind in a **new Python process**, as an Airflow worker
runs a task (a Dagster step likewise), on a 3-partition super stream of N 100-byte messages
(rstream `send_batch` of 1,000, as producers make them), each with a new consumer name into a new
Parquet folder, exactly-once:

- `connect`: `RabbitMQStreamReadOperator(spark_conn_id=...)` on the warm server;
- `consume`: `RabbitMQStreamConsumeOperator` (no Spark: Arrow batches to Parquet);
- `dagster-connect`: `build_stream_asset(engine="spark")` with a `SparkSessionResource(remote=...)`;
- `dagster-arrow`: `build_stream_asset(engine="arrow")`.

Each line gives `execute` (the operator's `execute()`, the asset's materialization) and the whole
process (Python's start, the imports, the task), medians over the rounds, and the ratio of each
Spark kind to its Spark-free twin. With `--breakdown` every Spark task also prints where its
`execute` went (session, plan with lease and record, the read's DataFrame, the one Spark action,
publish, commit record, record and watermark store, lag) and how many Python processes the server
started for it (a new Python process imports pyspark and rmqs: the cost `--breakdown` makes visible).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from bench.common import REPO, connection, fill_batches, temp_super_stream
from tests.support.connect_server import python_descendants

PARTITIONS = 3
SPARK_KINDS = {"connect": "consume", "dagster-connect": "dagster-arrow"}
KINDS = ("connect", "consume", "dagster-connect", "dagster-arrow")

# Where a Spark task's `execute` goes: (module, attribute, label). Patched in the task's process
# only (the bench's child), where the code looks the names up.
PHASES = (
    ("airflow_rmqs.operators", "connect_session", "session"),
    ("dagster_rmqs.resources.SparkSessionResource", "get_session", "session"),
    ("pyspark_rmqs.jobs", "plan_read", "plan (lease, record)"),
    ("pyspark_rmqs.runs.spark_io", "read_dataframe", "dataframe (source resolved, schema)"),
    ("pyspark_rmqs.runs.spark_io.FileOutput", "write_to", "spark action (read + write)"),
    ("pyspark_rmqs.runs.outputs.delivery.FileCommits", "publish", "publish"),
    ("pyspark_rmqs.runs.outputs.delivery.FileCommits", "commit", "commit record"),
    ("pyspark_rmqs.runs.steps", "store_watermarks_checked", "watermark store"),
    ("pyspark_rmqs.runs.record", "advance", "record writes"),
    ("pyspark_rmqs.runs.steps", "watermarks", "lag"),
)


def _patch_phases(spent: dict[str, float]) -> None:
    """Wrap each PHASES function so its wall time adds up in `spent` (nested calls count once)."""
    import importlib

    for target, attr, label in PHASES:
        module_name, _, cls = target.rpartition(".")
        try:
            owner: Any = importlib.import_module(target)
        except ImportError:
            try:
                owner = getattr(importlib.import_module(module_name), cls)
            except (ImportError, AttributeError):
                continue
        fn = getattr(owner, attr, None)
        if fn is None:
            continue
        setattr(owner, attr, _timed(fn, label, spent))


def _timed(fn: Callable[..., Any], label: str, spent: dict[str, float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

    return wrapper


def _child(kind: str, superstream: str, out: str, uri: str, consumer: str, remote: str) -> None:
    """In a new process: one task's `execute()` (or one asset materialization); print JSON."""
    started = time.perf_counter()
    os.environ["AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT"] = uri
    address, _, token = remote.partition("/;token=")
    host, _, port = address.rpartition(":")
    spark_conn = {"conn_type": "spark", "host": host, "port": int(port), "password": token}
    os.environ["AIRFLOW_CONN_SPARK_WARM"] = json.dumps(spark_conn)
    spent: dict[str, float] = {}
    if kind in ("connect", "consume"):
        run = _airflow_task(kind, superstream, out, consumer)
    else:
        run = _dagster_asset(kind, superstream, out, consumer, uri, remote)
    imported = time.perf_counter() - started
    if kind in SPARK_KINDS:
        _patch_phases(spent)
    t0 = time.perf_counter()
    rows = run()
    seconds = time.perf_counter() - t0
    result = {"imports_s": imported, "execute_s": seconds, "rows": rows, "phases": spent}
    result["ended"] = time.time()
    print("bench-result " + json.dumps(result), flush=True)


def _airflow_task(kind: str, superstream: str, out: str, consumer: str) -> Callable[[], int]:
    if kind == "connect":
        from airflow_rmqs.operators import RabbitMQStreamReadOperator

        op: Any = RabbitMQStreamReadOperator(
            task_id="bench_connect",
            superstream=superstream,
            consumer_name=consumer,
            output_path=out,
            metadata_fields="",
            spark_conn_id="spark_warm",
        )
    else:
        from airflow_rmqs.plain_operators import RabbitMQStreamConsumeOperator

        op = RabbitMQStreamConsumeOperator(
            task_id="bench_consume",
            superstream=superstream,
            consumer_name=consumer,
            output_path=out,
            metadata_fields="",
        )
    return lambda: int(op.execute({})["rows"])


def _dagster_asset(
    kind: str, superstream: str, out: str, consumer: str, uri: str, remote: str
) -> Callable[[], int]:
    from dagster import materialize

    from dagster_rmqs import RabbitMQStreamsResource, SparkSessionResource, build_stream_asset

    engine: Literal["spark", "arrow"] = "spark" if kind == "dagster-connect" else "arrow"
    asset = build_stream_asset(
        name="bench_" + kind.replace("-", "_"),
        superstream=superstream,
        consumer_name=consumer,
        output_path=out,
        engine=engine,
        metadata_fields="",
    )
    resources: dict[str, Any] = {"rabbitmq": RabbitMQStreamsResource(uris=uri)}
    if engine == "spark":
        resources["spark"] = SparkSessionResource(remote=remote)

    def run() -> int:
        result = materialize([asset], resources=resources)
        assert result.success
        mats = result.asset_materializations_for_node(asset.op.name)
        return int(str(mats[0].metadata["dagster/row_count"].value))

    return run


def _run(kind: str, superstream: str, uri: str, remote: str, server_pid: int | None) -> dict[str, Any]:
    consumer = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env.pop("JDK_JAVA_OPTIONS", None)
    with tempfile.TemporaryDirectory() as home:
        env["AIRFLOW_HOME"] = home
        env["DAGSTER_HOME"] = home
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        before = _python_children(server_pid)
        seen: dict[int, str] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(server_pid, before, seen, stop), daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        child = ["--child", kind, superstream, f"{home}/out", uri, consumer, remote]
        proc = subprocess.run(
            [sys.executable, "-m", "bench.warm_spark", *child],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"{kind} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        line = next(x for x in proc.stdout.splitlines() if x.startswith("bench-result "))
        got: dict[str, Any] = json.loads(line.split(" ", 1)[1])
        got["process_s"] = time.perf_counter() - t0
        got["exit_s"] = time.time() - got.pop("ended")  # from the task's return to the process's end
        stop.set()
        watcher.join()
        got["server_pythons"] = len(seen)
        got["server_python_modules"] = sorted(seen.values())
        return got


def _watch(pid: int | None, before: set[int], seen: dict[int, str], stop: threading.Event) -> None:
    """Sample the server's new Python processes every 20 ms: their module (`-m x`) or daemon role."""
    while not stop.is_set():
        for p in _python_children(pid) - before - set(seen):
            try:
                args = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode() for a in args if a]
            seen[p] = " ".join(w for w in words[1:] if not w.startswith("/"))[:80] or "?"
        stop.wait(0.02)


def _python_children(pid: int | None) -> set[int]:
    """Every Python process under the Connect server (its daemons and workers), alive now."""
    return set() if pid is None else set(python_descendants(pid))


@contextmanager
def _server(conf: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A warm Connect server (tests/support/connect_server.py: PySpark's own, local[2], a token)."""
    from tests.support.connect_server import start_connect_server

    token = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as work:
        server = start_connect_server(Path(work), token, conf=conf)
        try:
            yield f"sc://localhost:{server.port}/;token={token}", server.proc.pid
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--breakdown", action="store_true", help="print each Spark task's phases")
    ap.add_argument("--server-conf", action="append", default=[], help="key=value for the Connect server")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    kinds = [k for k in args.kinds.split(",") if k]
    conn = connection()
    host, port = conn.endpoints[0]
    secret = quote(conn.password.get_secret_value(), safe="")
    uri = f"rabbitmq-stream://{quote(conn.username)}:{secret}@{host}:{port}/{quote(conn.vhost, safe='')}"
    n = args.messages
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    with (
        temp_super_stream(conn, PARTITIONS, "bench-warm-spark") as (name, parts),
        _server(dict(kv.split("=", 1) for kv in args.server_conf)) as (remote, pid),
    ):
        per = {p: n // PARTITIONS + (i < n % PARTITIONS) for i, p in enumerate(parts)}
        fill_batches(conn, per, n, 1_000)
        for r in range(args.rounds):
            for kind in kinds:
                got = _run(kind, name, uri, remote, pid)
                assert got["rows"] == n, f"{kind}: read {got['rows']} of {n}"
                runs[kind].append(got)
                took = (
                    f"execute {got['execute_s']:.2f} s, process {got['process_s']:.2f} s "
                    f"(imports {got['imports_s']:.2f} s, exit {got['exit_s']:.2f} s)"
                )
                line = f"round {r + 1} {kind}: {took}"
                if kind in SPARK_KINDS:
                    line += f", server Python processes started {got['server_pythons']}"
                    if args.breakdown:
                        line += f" {got['server_python_modules']}"
                print(line, flush=True)
                if args.breakdown and got["phases"]:
                    phases = ", ".join(f"{k} {v:.2f}" for k, v in got["phases"].items())
                    print(f"    {phases}", flush=True)
    med = {
        k: {m: statistics.median(g[m] for g in v) for m in ("execute_s", "process_s")}
        for k, v in runs.items()
    }
    for spark_kind, plain in SPARK_KINDS.items():
        if spark_kind in med and plain in med:
            s, p = med[spark_kind], med[plain]
            print(
                f"warm Spark Connect, {n:,} messages into Parquet, medians of {args.rounds}: {spark_kind} "
                f"execute {s['execute_s']:.2f} s / {plain} {p['execute_s']:.2f} s = "
                f"{s['execute_s'] / p['execute_s']:.2f}x; process {s['process_s']:.2f} s / "
                f"{p['process_s']:.2f} s = {s['process_s'] / p['process_s']:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
