"""Spark sink throughput against a bare rstream producer, in one run against the same broker.

    .venv/bin/python -m bench.spark_write [--messages N] [--rounds 3]

The bare side is bench.writer's baseline: rstream's `send_batch` of N pre-built messages
(100-byte bodies) to a fresh stream, clock stopped at the last confirm. The Spark side (`local[2]`,
warmed up by a small write first) writes `spark.range(0, N, 1, 2)` as 100-byte `value`s to
another fresh stream with `df.write.format("rabbitmq_streams")`; the clock covers the whole
`save()`, which returns once every task's messages are confirmed. A third side writes with
`subEntrySize=100` (opt-in; deduplication is not guaranteed then). Prints one line per side, with
the ratio to the bare producer and the local broker's CPU seconds over that side's best timed span
(`spark sink: ... 0.85x; broker CPU 2.10 s`), then the `broker-bound:` line of bench.writer.
Each side is the best of `--rounds` interleaved rounds (bench.common.best_measured).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from bench.common import (
    ROUNDS,
    Measured,
    best_measured,
    broker_bound,
    connection,
    report,
    spark_session,
    temp_stream,
    timed,
)
from bench.writer import SUB_ENTRY_SIZE, bare_round
from pyspark_rmqs.broker.client import BrokerClient

PARTITIONS = 2
WARMUP = 2_000  # rows written by the warm-up job


def _spark_write(spark: Any, stream: str, count: int, sub_entry_size: int = 1) -> None:
    df = spark.range(0, count, 1, PARTITIONS).selectExpr("repeat('x', 100) as value")
    writer = df.write.format("rabbitmq_streams").option("endpoints", "localhost:5552")
    writer = writer.option("subEntrySize", str(sub_entry_size))
    writer.option("stream", stream).mode("append").save()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="best of this many interleaved rounds")
    args = ap.parse_args()
    n = args.messages
    conn = connection()
    spark = spark_session("rmqs-bench-spark-write")

    def bare(_round: int) -> Measured:
        return bare_round(conn, n)

    def sink(sub_entry_size: int) -> Callable[[int], Measured]:
        def run(_round: int) -> Measured:
            with temp_stream(conn, "bench-spark-write") as stream:
                # JVM, Python workers, imports, broker connections and publisher declarations
                _spark_write(spark, stream, WARMUP, sub_entry_size)
                measured, _ = timed(lambda: _spark_write(spark, stream, n, sub_entry_size))
                tail = BrokerClient(conn).tail(stream)
                assert tail == WARMUP + n, (tail, WARMUP + n)
                return measured

        return run

    cpu: dict[str, float] = {}
    try:
        best = best_measured(args.rounds, {"bare": bare, "sink": sink(1), "sub": sink(SUB_ENTRY_SIZE)}, cpu)
    finally:
        spark.stop()
    base = report("bare rstream producer", n, best["bare"], broker_cpu=cpu.get("bare"))
    report("spark sink", n, best["sink"], base, cpu.get("sink"))
    report(f"spark sink, subEntrySize={SUB_ENTRY_SIZE} (opt-in)", n, best["sub"], base, cpu.get("sub"))
    broker_bound(n, best["bare"], cpu.get("sink"))


if __name__ == "__main__":
    main()
