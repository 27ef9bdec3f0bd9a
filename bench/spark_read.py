"""Spark batch-read throughput against a bare rstream consumer, on chunks as producers make them.

    .venv/bin/python -m bench.spark_read [--messages N] [--batches 100,1000,10000] [--rounds 3] [--memory]
                                         [--memory-sizes 1000000,10000000]

For each publish-batch size B, N 100-byte messages are spread evenly over a fresh 2-partition super
stream through rstream's own `Producer.send_batch` of B messages per call (bench.common.fill_batches;
the average messages per chunk the broker made is printed). The bare rstream consumer drains both
partitions concurrently (one subscription each, one asyncio loop); Spark (`local[2]`) reads the super
stream into the `noop` sink, once with no metadata columns and once with all of them, two ways:

- **cold**: the first read of a fresh session, in a new process each round (`--cold-child`): what
  every Airflow task with a local session, every Dagster run process and every `spark-submit` of a
  scheduled job gets. Timed from `spark.read` to the last row, after the session started (its start
  is printed apart); and once more with its Python workers started by a read of one message per
  partition first (what the fresh JVM costs apart from the Python processes' start);
- **warm**: a long-lived session warmed up by a tiny read first (the best case).

Each side is the best of `--rounds` interleaved rounds. Prints one line per side and a summary line
per size: `spark read B=100 (50.0 msg/chunk): bare 250,000 msg/s; cold: fixed columns 0.77x (workers
started 0.9x), all metadata 0.60x (session start 6.1 s); warm: fixed columns 1.56x, all metadata 1.20x`.

With `--memory`, also the peak RSS of a separate Python process iterating a `RangeReader` over
the first 1,000,000 and 10,000,000 messages of a single stream and discarding the batches:
`reader peak RSS for 1,000,000 messages: X MiB`. It should not grow with the range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.common import (
    REPO,
    ROUNDS,
    Measured,
    Span,
    best_measured,
    chunk_stats,
    connection,
    fill,
    fill_batches,
    report,
    spark_session,
    temp_stream,
    temp_super_stream,
    timed_side,
)
from bench.reader import BATCHES, _bare, sizes
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.options import ConnectionOptions

PARTITIONS = 2
WARMUP = 1_000  # messages per partition read by the warm-up query


async def _bare_all(conn: ConnectionOptions, counts: dict[str, int]) -> int:
    """One bare consumer per partition stream, all on this loop; returns the messages seen."""
    seen = await asyncio.gather(*(_bare(conn, stream, n) for stream, n in counts.items() if n))
    return sum(seen)


def source(spark: Any, superstream: str, fields: str | None, ending: dict[str, int] | None = None) -> Any:
    reader = spark.read.format("rabbitmq_streams")
    reader = reader.option("endpoints", "localhost:5552").option("superstream", superstream)
    if fields is not None:
        reader = reader.option("metadataFields", fields)
    if ending is not None:
        reader = reader.option("endingOffsets", json.dumps(ending))
    return reader.load()


def _spark_read(
    spark: Any, superstream: str, fields: str | None, ending: dict[str, int] | None = None
) -> int:
    """Read the super stream into the noop sink; returns the row count observed on the way."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    seen = Observation("rows")
    df = source(spark, superstream, fields, ending).observe(seen, F.count(F.lit(1)).alias("rows"))
    df.write.format("noop").mode("overwrite").save()
    return int(seen.get["rows"])


def _cold_child(superstream: str, fields: str, workers: str = "fresh") -> None:
    """In a new process: start a session, read once; print the session start and the read as JSON.

    `workers="started"`: a read of the first messages of each partition first (Spark's Python
    workers started and their imports done, as after any earlier read in the session), so the timed
    read shows what a fresh JVM costs apart from the Python processes' start.
    """
    started = time.perf_counter()
    spark = spark_session("rmqs-bench-cold-read")
    session_s = time.perf_counter() - started
    if workers == "started":
        parts = [f"{superstream}-{i}" for i in range(PARTITIONS)]
        _spark_read(spark, superstream, None if fields == "all" else fields, {p: 1 for p in parts})
    span = Span()
    rows = _spark_read(spark, superstream, None if fields == "all" else fields)
    m = span.done()
    print(json.dumps({"session_s": session_s, "read_s": m.seconds, "broker_cpu": m.broker_cpu, "rows": rows}))
    spark.stop()


def _cold(
    superstream: str, fields: str, count: int, sessions: list[float], workers: str = "fresh"
) -> Measured:
    """The first read of a fresh session in a new process, which must see `count` rows; its session
    start is added to `sessions`."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.spark_read", "--cold-child", superstream, fields, workers],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["rows"] == count, f"cold {fields or 'fixed'}: saw {got['rows']:,} of {count:,}"
    sessions.append(got["session_s"])
    return Measured(got["read_s"], got["broker_cpu"])


def spread(parts: list[str], n: int) -> dict[str, int]:
    return {p: n // len(parts) + (i < n % len(parts)) for i, p in enumerate(parts)}


def _rss_child(stream: str, count: int) -> None:
    """In the child process: drain [0, count) of `stream`, then print this process's peak RSS in KiB."""
    rows = 0
    for batch in RangeReader(connection(), stream, 0, count, ReadSettings()):
        rows += batch.num_rows
    assert rows == count, (rows, count)
    with open("/proc/self/status") as f:
        hwm = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    print(hwm, flush=True)


def _peak_rss_mib(stream: str, count: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "bench.spark_read", "--rss-child", stream, str(count)],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.split()[-1]) / 1024


def _memory(conn: ConnectionOptions, counts: list[int]) -> None:
    with temp_stream(conn, "bench-spark-read-mem") as stream:
        fill(conn, stream, max(counts))
        for n in counts:
            print(f"reader peak RSS for {n:,} messages: {_peak_rss_mib(stream, n):,.1f} MiB", flush=True)


def _one_size(conn: ConnectionOptions, spark: Any, n: int, batch: int, rounds: int, cold: bool) -> str:
    with temp_super_stream(conn, PARTITIONS, "bench-spark-read") as (name, parts):
        counts = spread(parts, n)
        fill_batches(conn, counts, n, batch)
        per_chunk = n / sum(counts[p] / chunk_stats(conn, p, counts[p]) for p in parts)
        print(f"-- send_batch of {batch:,}: {per_chunk:,.1f} messages per chunk on average", flush=True)
        ending = {p: min(WARMUP, c) for p, c in counts.items()}
        for fields in ("", None):  # JVM, Python workers, imports and broker connections
            _spark_read(spark, name, fields, ending)
        cpu: dict[str, float] = {}
        sessions: list[float] = []
        sides: dict[str, Callable[[int], Measured]] = {
            "bare": timed_side("bare", n, lambda _r: asyncio.run(_bare_all(conn, counts))),
            "fixed": timed_side("fixed", n, lambda _r: _spark_read(spark, name, "")),
            "meta": timed_side("meta", n, lambda _r: _spark_read(spark, name, None)),
        }
        if cold:
            sides["cold fixed"] = lambda _r: _cold(name, "", n, sessions)
            sides["cold meta"] = lambda _r: _cold(name, "all", n, sessions)
            sides["cold started"] = lambda _r: _cold(name, "", n, [], "started")
        best = best_measured(rounds, sides, cpu)
        base = report("bare rstream consumer", n, best["bare"], broker_cpu=cpu.get("bare"))
        line = f"spark read B={batch} ({per_chunk:,.1f} msg/chunk): bare {base:,.0f} msg/s; "
        if cold:
            c_fixed = report("spark cold fixed columns", n, best["cold fixed"], base, cpu.get("cold fixed"))
            c_meta = report("spark cold all metadata", n, best["cold meta"], base, cpu.get("cold meta"))
            c_started = report(
                "spark cold fixed columns, workers started",
                n,
                best["cold started"],
                base,
                cpu.get("cold started"),
            )
            start = min(sessions)
            line += (
                f"cold: fixed columns {c_fixed / base:.2f}x (workers started {c_started / base:.2f}x), "
                f"all metadata {c_meta / base:.2f}x "
                f"(session start {start:.1f} s); "
            )
        fixed = report("spark warm fixed columns", n, best["fixed"], base, cpu.get("fixed"))
        meta = report("spark warm all metadata", n, best["meta"], base, cpu.get("meta"))
    return line + f"warm: fixed columns {fixed / base:.2f}x, all metadata {meta / base:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batches", default=BATCHES, help="messages per rstream send_batch, comma-separated")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="best of this many interleaved rounds")
    ap.add_argument("--memory", action="store_true", help="also measure the reader's peak RSS (slow)")
    ap.add_argument("--memory-sizes", default="1000000,10000000", help="comma-separated message counts")
    ap.add_argument("--no-cold", action="store_true", help="only the warm session (no new processes)")
    ap.add_argument("--rss-child", nargs=2, metavar=("STREAM", "COUNT"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--cold-child", nargs=3, metavar=("SUPERSTREAM", "FIELDS", "WORKERS"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child[0], int(args.rss_child[1]))
        return
    if args.cold_child:
        _cold_child(*args.cold_child)
        return
    conn = connection()
    spark = spark_session("rmqs-bench-spark-read")
    try:
        summary = [
            _one_size(conn, spark, args.messages, b, args.rounds, not args.no_cold)
            for b in sizes(args.batches)
        ]
    finally:
        spark.stop()
    for line in summary:
        print(line, flush=True)
    if args.memory:
        _memory(conn, sorted(sizes(args.memory_sizes)))


if __name__ == "__main__":
    main()
