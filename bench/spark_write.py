"""Spark sink throughput against a bare rstream producer, in one run against the same broker.

    .venv/bin/python -m bench.spark_write [--messages N] [--rounds 3]

The bare side is bench.writer's baseline: rstream's `send_batch` of N pre-built messages
(100-byte bodies) to a fresh stream, clock stopped at the last confirm. The Spark side (`local[2]`,
warmed up by a small write first) writes `spark.range(0, N, 1, 2)` as 100-byte `value`s to
another fresh stream with `df.write.format("rabbitmq_streams")`; the clock covers the whole
`save()`, which returns once every task's messages are confirmed. Prints one line per side, the
second ending in the ratio to the bare producer: `spark sink: ... 0.85x`. Each side is the best of
`--rounds` interleaved rounds (bench.common.best_measured).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.common import ROUNDS, best_measured, connection, report, spark_session, temp_stream, timed
from bench.writer import _bare
from pyspark_rmqs.broker.client import BrokerClient

PARTITIONS = 2
WARMUP = 2_000  # rows written by the warm-up job


def _spark_write(spark: Any, stream: str, count: int) -> None:
    df = spark.range(0, count, 1, PARTITIONS).selectExpr("repeat('x', 100) as value")
    writer = df.write.format("rabbitmq_streams").option("endpoints", "localhost:5552")
    writer.option("stream", stream).mode("append").save()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="best of this many interleaved rounds")
    args = ap.parse_args()
    n = args.messages
    conn = connection()
    spark = spark_session("rmqs-bench-spark-write")

    def bare(_round: int) -> float:
        with temp_stream(conn, "bench-spark-write-bare") as stream:
            return asyncio.run(_bare(conn, stream, n))

    def sink(_round: int) -> float:
        with temp_stream(conn, "bench-spark-write") as stream:
            # JVM, Python workers, imports, broker connections and publisher declarations
            _spark_write(spark, stream, WARMUP)
            secs, _ = timed(lambda: _spark_write(spark, stream, n))
            tail = BrokerClient(conn).tail(stream)
            assert tail == WARMUP + n, (tail, WARMUP + n)
            return secs

    try:
        best = best_measured(args.rounds, {"bare": bare, "sink": sink})
    finally:
        spark.stop()
    base = report("bare rstream producer", n, best["bare"])
    report("spark sink", n, best["sink"], base)


if __name__ == "__main__":
    main()
