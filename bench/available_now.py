"""An AvailableNow drain into Parquet against the batch read into Parquet, in one run on one super stream.

    .venv/bin/python -m bench.available_now [--messages N] [--batch B] [--rounds R]

N 100-byte messages (default 1,000,000) over a 2-partition super stream, published through rstream's
`send_batch` of B messages (default 1,000). Each round writes the whole super stream (fixed columns)
into a fresh Parquet folder twice: `spark.read` + `df.write.parquet` (the baseline) and
`spark.readStream` + `trigger(availableNow=True)` into the `parquet` sink with a fresh checkpoint.
Prints the best time of each and the ratio: `available-now drain is 1.12x the batch read's time`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench.common import best_of, connection, fill_batches, report, spark_session, temp_super_stream
from bench.spark_read import PARTITIONS, source, spread


def _batch(spark: Any, superstream: str, out: Path) -> int:
    source(spark, superstream, "").write.mode("overwrite").parquet(str(out))
    return int(spark.read.parquet(str(out)).count())


def _drain(spark: Any, superstream: str, out: Path, checkpoint: Path) -> int:
    df = spark.readStream.format("rabbitmq_streams")
    df = df.option("endpoints", "localhost:5552").option("superstream", superstream)
    df = df.option("metadataFields", "").option("startingOffsets", "earliest").load()
    query = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination()
    return int(spark.read.parquet(str(out)).count())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1_000, help="messages per rstream send_batch")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    n = args.messages
    conn = connection()
    spark = spark_session("rmqs-bench-available-now")
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
                    "drain": lambda r: _drain(spark, name, Path(tmp) / f"drain-{r}", Path(tmp) / f"ckpt-{r}"),
                },
            )
    finally:
        spark.stop()
    base = report("batch read into Parquet", n, best["batch"])
    report("AvailableNow drain into Parquet", n, best["drain"], base)
    print(f"available-now drain is {best['drain'] / best['batch']:.2f}x the batch read's time", flush=True)


if __name__ == "__main__":
    main()
