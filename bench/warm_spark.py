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
- `dagster-arrow`: `build_stream_asset(engine="arrow")`;
- `spark-floor` (only with `--kinds`): no rmqs, the least any Spark Connect task does: open the
  same server-side session, then Spark's own job writing as many rows of the same shape into
  Parquet (`spark.range`). Its ratio to `consume` bounds from below what a Spark task can reach here.

Each line gives `execute` (the operator's `execute()`, the asset's materialization) and the whole
process (Python's start, the imports, the task), medians over the rounds, and the ratio of each
Spark kind to its Spark-free twin. With `--breakdown` every Spark task also prints where its
`execute` went (session, plan with lease and record, the read's DataFrame, the one Spark action,
publish, commit record, record and watermark store, lag) and how many Python processes the server
started for it (a new Python process imports pyspark and rmqs: the cost `--breakdown` makes visible),
and the server's CPU seconds during the task by kind of thread: `jit` (the JVM's compiler threads),
`tasks` (Spark's task threads: Arrow to rows to Parquet), `python` (its Python workers: the reads),
`gc` and `other` (/proc, so it holds on a loaded machine where wall times do not).

`--warmup N` runs N untimed Spark tasks on the fresh server first: its JIT compiles ~0.7 s of CPU
per task for the first ten or so tasks and ~0.2 s after fifteen (measured with this breakdown), so
rounds 2-3 on a fresh server measure the JVM's warm-up as much as the connector.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.common import REPO, connection, fill_batches, temp_super_stream
from bench.warm_task import PARTITIONS, SPARK_KINDS
from tests.support.connect_server import python_descendants

KINDS = ("connect", "consume", "dagster-connect", "dagster-arrow")  # and `spark-floor` when asked


def _run(
    kind: str, superstream: str, uri: str, remote: str, server_pid: int | None, n: int, breakdown: bool
) -> dict[str, Any]:
    consumer = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env.pop("JDK_JAVA_OPTIONS", None)
    with tempfile.TemporaryDirectory() as home:
        env["AIRFLOW_HOME"] = home
        env["DAGSTER_HOME"] = home
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        env["BENCH_MESSAGES"] = str(n)
        before = _python_children(server_pid)
        cpu_before = _server_cpu(server_pid) if kind in SPARK_KINDS else {}
        seen: dict[int, str] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(server_pid, before, seen, stop), daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        child = [kind, superstream, f"{home}/out", uri, consumer, remote]
        child += ["--breakdown"] if breakdown else []
        proc = subprocess.run(
            [sys.executable, "-m", "bench.warm_task", *child],
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
        cpu_after = _server_cpu(server_pid) if kind in SPARK_KINDS else {}
        got["server_cpu"] = {}
        for k, v in cpu_after.items():  # the threads and workers alive at the end, summed by kind
            key = k.split()[0]
            got["server_cpu"][key] = got["server_cpu"].get(key, 0.0) + v - cpu_before.get(k, 0.0)
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


def _server_cpu(pid: int | None) -> dict[str, float]:
    """CPU seconds so far of each of the server's JVM threads and Python workers alive now, keyed
    `"<kind> <id>"` (a thread or worker that ends between two snapshots drops out, never negative)."""
    if pid is None:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}

    def add(kind: str, stat: str) -> None:
        fields = stat.rsplit(")", 1)[1].split()
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick

    for p in python_descendants(pid):  # one key per process: a worker that exits meanwhile drops out
        try:
            add(f"python {p}", Path(f"/proc/{p}/stat").read_text())
        except OSError:
            continue
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        kind = "jit" if "CompilerThre" in name else "tasks" if name.startswith("Executor task") else None
        kind = kind or ("gc" if name.startswith(("GC Thread", "G1 ")) else "other")
        add(f"{kind} {tid}", stat)
    return out


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
    ap.add_argument("--warmup", type=int, default=0, help="untimed Spark tasks on the fresh server first")
    ap.add_argument("--server-conf", action="append", default=[], help="key=value for the Connect server")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    conn = connection()
    host, port = conn.endpoints[0]
    secret = quote(conn.password.get_secret_value(), safe="")
    uri = f"rabbitmq-stream://{quote(conn.username)}:{secret}@{host}:{port}/{quote(conn.vhost, safe='')}"
    n = args.messages
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    print("load average (1, 5, 15 min) at the start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    with (
        temp_super_stream(conn, PARTITIONS, "bench-warm-spark") as (name, parts),
        _server(dict(kv.split("=", 1) for kv in args.server_conf)) as (remote, pid),
    ):
        per = {p: n // PARTITIONS + (i < n % PARTITIONS) for i, p in enumerate(parts)}
        fill_batches(conn, per, n, 1_000)
        for w in range(args.warmup):  # past the JVM's warm-up (its JIT), not measured
            spark_kind = next((k for k in kinds if k in ("connect", "dagster-connect")), "connect")
            got = _run(spark_kind, name, uri, remote, pid, n, False)
            print(f"warm-up {w + 1} {spark_kind}: execute {got['execute_s']:.2f} s", flush=True)
        for r in range(args.rounds):
            for kind in kinds:
                got = _run(kind, name, uri, remote, pid, n, args.breakdown)
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
                if args.breakdown and got.get("server_cpu"):
                    cpu = ", ".join(f"{k} {v:.2f}" for k, v in sorted(got["server_cpu"].items()))
                    print(f"    server CPU s: {cpu}", flush=True)
    print("load average (1, 5, 15 min) at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    med = {
        k: {m: statistics.median(g[m] for g in v) for m in ("execute_s", "process_s")}
        for k, v in runs.items()
    }
    if "connect" in med and "spark-floor" in med:
        added = med["connect"]["execute_s"] - med["spark-floor"]["execute_s"]
        print(
            f"warm Spark Connect, {n:,} messages: the Airflow Spark task's execute over the floor "
            f"(session + Spark's own write, no rmqs): {added:+.2f} s",
            flush=True,
        )
    for spark_kind, plain in SPARK_KINDS.items():
        if spark_kind in med and plain in med:
            s, p = med[spark_kind], med[plain]
            warm = f", after {args.warmup} warm-up tasks" if args.warmup else ""
            print(
                f"warm Spark Connect{warm}, {n:,} messages into Parquet, medians of {args.rounds}: "
                f"{spark_kind} "
                f"execute {s['execute_s']:.2f} s / {plain} {p['execute_s']:.2f} s = "
                f"{s['execute_s'] / p['execute_s']:.2f}x"
                + (  # the floor's process imports no orchestrator: its process time compares nothing
                    ""
                    if spark_kind == "spark-floor"
                    else f"; process {s['process_s']:.2f} s / {p['process_s']:.2f} s = "
                    f"{s['process_s'] / p['process_s']:.2f}x"
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
