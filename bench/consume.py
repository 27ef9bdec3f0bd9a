"""The Spark-free consume core (`consume.run_consume`, RabbitMQStreamConsumeOperator's engine)
against a bare rstream consumer, in one run on the same stream.

    .venv/bin/python -m bench.consume [--messages N]

Prints one line per comparison, ending in the ratio to the bare consumer: the watermark-protocol
read into a counting `apply_function`, and into Parquet files.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Callable
from typing import Any

from bench.common import connection, fill, report, temp_stream, timed
from bench.reader import _bare
from pyspark_rmqs import jobs
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.runs import consume


def _consume(
    conn: ConnectionOptions, stream: str, count: int, sink: consume.RangeSink | Callable[[Any], Any]
) -> int:
    plan = jobs.plan_read(conn, stream=stream, consumer="bench", start="watermark", persist=False)
    summary = consume.run_consume(conn, plan, sink, store_watermark=False, metadata_fields="")
    assert summary.rows == count, (summary.rows, count)
    return count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    n = ap.parse_args().messages
    conn = connection()
    with temp_stream(conn, "bench-consume") as stream, tempfile.TemporaryDirectory() as out:
        fill(conn, stream, n)
        rows = [0]

        def count(batch: object) -> None:
            rows[0] += batch.num_rows  # type: ignore[attr-defined]

        m, _ = timed(lambda: asyncio.run(_bare(conn, stream, n)))
        base = report("bare rstream consumer", n, m.seconds)
        m, _ = timed(lambda: _consume(conn, stream, n, count))
        report("consume -> apply_function", n, m.seconds, base)
        m, _ = timed(lambda: _consume(conn, stream, n, consume.ParquetSink(out)))
        report("consume -> Parquet", n, m.seconds, base)


if __name__ == "__main__":
    main()
