"""An AvailableNow drain into Parquet against the batch read into Parquet, in one run on one super stream.

    .venv/bin/python -m bench.available_now [--messages N] [--batch B] [--rounds R]

N 100-byte messages (default 1,000,000) over a 2-partition super stream, published through rstream's
`send_batch` of B messages (default 1,000). Each round writes the whole super stream (fixed columns)
into a fresh Parquet folder twice: `spark.read` + `df.write.parquet` (the baseline) and
`spark.readStream` + `trigger(availableNow=True)` into the `parquet` sink with a fresh checkpoint.
Prints the best time of each and the ratio: `available-now drain is 1.12x the batch read's time`.

A drain pays a fixed cost before its first micro-batch that a batch read does not: Spark starts a
fresh Python process for the query's streaming source (`createSimpleWorker`, where the batch
read's planning reuses the warm daemon), with pyspark's own zip first on its path. The bench prints
that wait (query start to the first micro-batch's trigger, from the query's progress) and what a
fresh interpreter takes to import Spark's runner module from the zip and from site-packages, so
each run shows how much of the ratio is start-up: `before the first micro-batch: ...`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import best_of, connection, fill_batches, report, spark_session, temp_super_stream
from bench.spark_read import PARTITIONS, source, spread


def _batch(spark: Any, superstream: str, out: Path) -> int:
    source(spark, superstream, "").write.mode("overwrite").parquet(str(out))
    return int(spark.read.parquet(str(out)).count())


RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"  # Spark's per-query source process


def _drain(spark: Any, superstream: str, out: Path, checkpoint: Path, waits: list[float]) -> int:
    """Drain the super stream into Parquet; appends to `waits` the seconds from `start()` to the
    first micro-batch's trigger."""
    df = spark.readStream.format("rabbitmq_streams")
    df = df.option("endpoints", "localhost:5552").option("superstream", superstream)
    df = df.option("metadataFields", "").option("startingOffsets", "earliest").load()
    started = time.time()
    query = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination()
    first = query.recentProgress[0]["timestamp"]  # e.g. 2026-11-26T13:44:42.214Z
    waits.append(datetime.fromisoformat(first.replace("Z", "+00:00")).timestamp() - started)
    return int(spark.read.parquet(str(out)).count())


def runner_import_s(from_zip: bool, tries: int = 3) -> float:
    """Best seconds a fresh interpreter takes to import Spark's streaming-source runner: with
    pyspark's zip first on the path, as Spark starts it, or from site-packages."""
    import pyspark

    env = dict(os.environ)
    if from_zip:
        lib = Path(pyspark.__file__).parent / "python" / "lib"
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted(lib.glob("*.zip")))
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {RUNNER}"], env=env, check=True)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1_000, help="messages per rstream send_batch")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    n = args.messages
    conn = connection()
    spark = spark_session("rmqs-bench-available-now")
    waits: list[float] = []
    try:
        with (
            temp_super_stream(conn, PARTITIONS, "bench-available-now") as (name, parts),
            tempfile.TemporaryDirectory() as tmp,
        ):
            fill_batches(conn, spread(parts, n), n, args.batch)
            best = best_of(
                args.rounds,
                n,
                {
                    "batch": lambda r: _batch(spark, name, Path(tmp) / f"batch-{r}"),
                    "drain": lambda r: _drain(
                        spark, name, Path(tmp) / f"drain-{r}", Path(tmp) / f"ckpt-{r}", waits
                    ),
                },
            )
    finally:
        spark.stop()
    base = report("batch read into Parquet", n, best["batch"])
    report("AvailableNow drain into Parquet", n, best["drain"], base)
    print(f"available-now drain is {best['drain'] / best['batch']:.2f}x the batch read's time", flush=True)
    print(
        f"before the first micro-batch: {min(waits):.2f}-{max(waits):.2f} s; a fresh Python imports "
        f"Spark's source runner in {runner_import_s(True):.2f} s from pyspark.zip (as Spark starts it), "
        f"{runner_import_s(False):.2f} s from site-packages",
        flush=True,
    )


if __name__ == "__main__":
    main()
