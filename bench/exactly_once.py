"""The cost of exactly-once delivery: a watermark run into Parquet, exactly-once against at-least-once.

    .venv/bin/python -m bench.exactly_once [--messages N] [--rounds R]

N 100-byte messages (default 1,000,000) in one stream. Each round runs `jobs.plan_read` +
`jobs.run_read` into Parquet twice with fresh consumers and folders: once with
`delivery="at_least_once"` (the baseline, written straight into the folder) and once with the
default exactly-once (staged, renamed into `rmqs_run=<token>/`, commit record, then the watermark).
Prints the best time of each and the overhead: `exactly-once overhead: +X.X%`.

A third side is the same read as a backfill (explicit offsets, no consumer): no lease, no run
record, no watermark store. Against it, the at-least-once watermark run shows what the run
protocol itself costs (`run record overhead: +X.X%`: lease, record writes, the store).
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from bench.common import best_of, connection, fill, report, spark_session, temp_stream
from pyspark_rmqs import jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    conn = connection()
    spark = spark_session("rmqs-bench-exactly-once")
    with temp_stream(conn) as stream, tempfile.TemporaryDirectory() as tmp:
        fill(conn, stream, args.messages)

        def run(delivery: str, backfill: bool = False) -> int:
            consumer = f"bench-{uuid.uuid4().hex[:8]}"
            sink = jobs.write_output(str(Path(tmp) / consumer), delivery=delivery)
            if backfill:
                plan = jobs.plan_read(conn, stream=stream, start="earliest")
            else:
                plan = jobs.plan_read(conn, stream=stream, consumer=consumer)
            return int(jobs.run_read(spark, conn, plan, sink, metadata_fields="").rows or 0)

        best = best_of(
            args.rounds,
            args.messages,
            {
                "backfill": lambda _r: run("at_least_once", backfill=True),
                "at_least_once": lambda _r: run("at_least_once"),
                "exactly_once": lambda _r: run("exactly_once"),
            },
        )
    bare = report("backfill run into Parquet (no lease, record or store)", args.messages, best["backfill"])
    base = report("at-least-once run into Parquet", args.messages, best["at_least_once"], bare)
    report("exactly-once run into Parquet", args.messages, best["exactly_once"], base)
    overhead = best["exactly_once"] / best["at_least_once"] - 1
    print(f"exactly-once overhead: {overhead * 100:+.1f}%", flush=True)
    protocol = best["at_least_once"] / best["backfill"] - 1
    print(f"run record overhead: {protocol * 100:+.1f}%", flush=True)


if __name__ == "__main__":
    main()
