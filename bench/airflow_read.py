"""One Airflow read task end to end, in a new process: Spark (local) against the Spark-free consume.

    .venv/bin/python -m bench.airflow_read [--messages N] [--rounds 3] [--no-archive] [--zip-pyspark]

A 3-partition super stream of N 100-byte messages (rstream `send_batch` of 1,000, as producers make
them). Each round runs, in a new Python process as an Airflow worker runs a task, once each:

- `RabbitMQStreamReadOperator` (local Spark session started by the task, Parquet to a folder);
- `RabbitMQStreamConsumeOperator` (no Spark: Arrow batches to Parquet);

each with a new consumer name, from `execute()`'s start to its return (the watermark stored). The
process's own start (Python, Airflow's and the operator's imports) is printed apart. The Spark task
maps Spark's class-data archive when `rmqs spark-archive` dumped one (`make bench` uses the one
`make prepare` dumps), `--no-archive` to see it without; Spark's Python processes import the venv's
compiled pyspark where `rmqs spark-archive --compiled-pyspark` ran (the suite's venv), `--zip-pyspark`
to see them compile pyspark.zip as by default. Prints, best of the rounds:
`airflow read task, 100,000 messages into Parquet: spark 12.3 s (session 5.1 s), consume 2.0 s: 6.1x`;
then each task run again for a consumer name that read everything (nothing new: no Spark session).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.common import REPO, connection, fill_batches, temp_super_stream
from pyspark_rmqs.spark import pythonpath

PARTITIONS = 3


def _child(kind: str, superstream: str, out: str, uri: str, consumer: str) -> None:
    """In a new process: run one task's `execute()`; print its seconds and summary as JSON."""
    started = time.perf_counter()
    os.environ["AIRFLOW_CONN_RABBITMQ_STREAM_DEFAULT"] = uri
    if kind == "spark":
        from airflow_rmqs.operators import RabbitMQStreamReadOperator as Op
    else:
        from airflow_rmqs.plain_operators import RabbitMQStreamConsumeOperator as Op  # type: ignore[assignment]
    op = Op(
        task_id=f"bench_{kind}",
        superstream=superstream,
        consumer_name=consumer,
        output_path=out,
        metadata_fields="",
    )
    imported = time.perf_counter() - started
    t0 = time.perf_counter()
    summary: dict[str, Any] = op.execute({})
    seconds = time.perf_counter() - t0
    result = {"imports_s": imported, "execute_s": seconds, "rows": summary.get("rows")}
    print("bench-result " + json.dumps(result))


def _run(
    kind: str, superstream: str, uri: str, archive: bool, zip_pyspark: bool, consumer: str = ""
) -> dict[str, Any]:
    consumer = consumer or f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env.pop("JDK_JAVA_OPTIONS", None)
    if zip_pyspark:
        env[pythonpath.OFF_ENV] = "off"
    if archive:
        env.setdefault("RMQS_SPARK_CLASS_ARCHIVE", str(Path(sys.prefix) / "rmqs-spark-classes.jsa"))
    else:
        env["RMQS_SPARK_CLASS_ARCHIVE"] = "off"
    with tempfile.TemporaryDirectory() as home:
        env["AIRFLOW_HOME"] = home
        env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
        t0 = time.perf_counter()
        child = ["--child", kind, superstream, f"{home}/out", uri, consumer]
        out = subprocess.run(
            [sys.executable, "-m", "bench.airflow_read", *child],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        line = next(x for x in out.splitlines() if x.startswith("bench-result "))
        got: dict[str, Any] = json.loads(line.split(" ", 1)[1])
        got["process_s"] = time.perf_counter() - t0
        return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-archive", action="store_true", help="the Spark task without the class-data archive")
    ap.add_argument(
        "--zip-pyspark",
        action="store_true",
        help="Spark's Python processes compile pyspark.zip (as with no --compiled-pyspark)",
    )
    ap.add_argument(
        "--child", nargs=5, metavar=("KIND", "SUPERSTREAM", "OUT", "URI", "CONSUMER"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    conn = connection()
    host, port = conn.endpoints[0]
    secret = quote(conn.password.get_secret_value(), safe="")
    uri = f"rabbitmq-stream://{quote(conn.username)}:{secret}@{host}:{port}/{quote(conn.vhost, safe='')}"
    n = args.messages
    with temp_super_stream(conn, PARTITIONS, "bench-airflow-read") as (name, parts):
        per = {p: n // PARTITIONS + (i < n % PARTITIONS) for i, p in enumerate(parts)}
        fill_batches(conn, per, n, 1_000)
        best: dict[str, dict[str, Any]] = {}
        for _ in range(args.rounds):
            for kind in ("spark", "consume"):
                got = _run(kind, name, uri, archive=not args.no_archive, zip_pyspark=args.zip_pyspark)
                assert got["rows"] == n, f"{kind}: read {got['rows']} of {n}"
                print(
                    f"{kind}: execute {got['execute_s']:.2f} s, imports {got['imports_s']:.2f} s, "
                    f"process {got['process_s']:.2f} s",
                    flush=True,
                )
                if got["execute_s"] < best.get(kind, {"execute_s": float("inf")})["execute_s"]:
                    best[kind] = got
        idle: dict[str, float] = {}  # the same task again for a consumer that read everything
        for kind in ("spark", "consume"):
            consumer = f"bench-idle-{kind}-{uuid.uuid4().hex[:8]}"
            _run(kind, name, uri, not args.no_archive, args.zip_pyspark, consumer)
            got = _run(kind, name, uri, not args.no_archive, args.zip_pyspark, consumer)
            assert got["rows"] == 0, f"{kind}: read {got['rows']} again"
            idle[kind] = got["execute_s"]
    spark, plain = best["spark"]["execute_s"], best["consume"]["execute_s"]
    archive = "without the class-data archive" if args.no_archive else "with the class-data archive"
    compiled = pythonpath.installed() and not args.zip_pyspark
    pyspark_from = "compiled pyspark" if compiled else "pyspark.zip"
    print(
        f"airflow read task, {n:,} messages into Parquet (new process, {archive}, {pyspark_from}): "
        f"spark {spark:.1f} s, consume {plain:.1f} s: {spark / plain:.1f}x",
        flush=True,
    )
    print(
        f"the same task with nothing new after its watermark: spark {idle['spark']:.2f} s, "
        f"consume {idle['consume']:.2f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
