"""Reader throughput against a bare rstream consumer, on chunks as producers in the field make them.

    .venv/bin/python -m bench.reader [--messages N] [--batches 100,1000,10000] [--rounds 5]

For each publish-batch size B, N 100-byte messages go into a fresh stream through rstream's own
`Producer.send_batch` of B messages per call (about one chunk per call; the average messages per
chunk the broker made is printed). Then, on that stream, in one run: the bare rstream consumer,
`RangeReader` with the fixed columns and with all metadata columns, each the best of `--rounds`
interleaved rounds (bench.common.best_of; 5 here, not 3: on the 2-core machine six back-to-back
reads of the same 1 M messages in 50-message chunks took 1.47 to 3.74 s, broker CPU 1.39 to 2.39 s,
so 3 rounds could all land in the slow half). Prints one line per side, with the local broker's CPU
seconds in its best round, and a
summary line per size:
`B=100 (100.0 msg/chunk): bare 380,000 msg/s; fixed columns 1.52x; all metadata 0.95x`.
"""

from __future__ import annotations

import argparse
import asyncio

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

from bench.common import best_of, chunk_stats, connection, fill_batches, report, temp_stream
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.core.schema import METADATA_FIELDS
from pyspark_rmqs.options import ConnectionOptions

BATCHES = "100,1000,10000"
ROUNDS = 5


async def _bare(conn: ConnectionOptions, stream: str, count: int) -> int:
    """rstream's own consumer, no AMQP decoding: the per-message callback only counts."""
    host, port = conn.addresses()[0]
    seen = 0
    done = asyncio.Event()

    def on_message(_msg: bytes, _ctx: object) -> None:
        nonlocal seen
        seen += 1
        if seen >= count:
            done.set()

    async with Consumer(
        host, port, username=conn.username, password=conn.password.get_secret_value(), vhost=conn.vhost
    ) as c:
        await c.subscribe(
            stream,
            on_message,
            decoder=lambda b: b,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        await asyncio.wait_for(done.wait(), 600)
    return seen


def _ours(conn: ConnectionOptions, stream: str, count: int, fields: tuple[str, ...]) -> int:
    rows = 0
    for batch in RangeReader(conn, stream, 0, count, ReadSettings(metadata_fields=fields)):
        rows += batch.num_rows
    assert rows == count, (rows, count)
    return rows


def sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batches", default=BATCHES, help="messages per rstream send_batch, comma-separated")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="best of this many interleaved rounds")
    args = ap.parse_args()
    n = args.messages
    conn = connection()
    summary = []
    for size in sizes(args.batches):
        with temp_stream(conn, "bench-reader") as stream:
            fill_batches(conn, stream, n, size)
            per_chunk = chunk_stats(conn, stream, n)  # also warms the connection pool and imports
            print(f"-- send_batch of {size:,}: {per_chunk:,.1f} messages per chunk on average", flush=True)
            cpu: dict[str, float] = {}
            best = best_of(
                args.rounds,
                n,
                {
                    "bare": lambda _r: asyncio.run(_bare(conn, stream, n)),
                    "fixed": lambda _r: _ours(conn, stream, n, ()),
                    "meta": lambda _r: _ours(conn, stream, n, METADATA_FIELDS),
                },
                cpu,
            )
            base = report("bare rstream consumer", n, best["bare"], broker_cpu=cpu.get("bare"))
            fixed = report("RangeReader fixed columns", n, best["fixed"], base, cpu.get("fixed"))
            meta = report("RangeReader all metadata", n, best["meta"], base, cpu.get("meta"))
            summary.append(
                f"reader B={size} ({per_chunk:,.1f} msg/chunk): bare {base:,.0f} msg/s; "
                f"fixed columns {fixed / base:.2f}x; all metadata {meta / base:.2f}x"
            )
    for line in summary:
        print(line, flush=True)


if __name__ == "__main__":
    main()
