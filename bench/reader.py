"""Reader throughput against a bare rstream consumer, in one run on the same stream.

    .venv/bin/python -m bench.reader [--messages N]

Prints one line per comparison, ending in the ratio to the bare consumer:
`fixed columns: ... 1.23x`, `all metadata: ... 0.61x`.
"""

from __future__ import annotations

import argparse
import asyncio

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

from bench.common import connection, fill, report, temp_stream, timed
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.schema import METADATA_FIELDS


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    n = ap.parse_args().messages
    conn = connection()
    with temp_stream(conn, "bench-reader") as stream:
        fill(conn, stream, n)
        _ours(conn, stream, min(n, 1000), ())  # warm the connection pool and imports
        secs, _ = timed(lambda: asyncio.run(_bare(conn, stream, n)))
        base = report("bare rstream consumer", n, secs)
        secs, _ = timed(lambda: _ours(conn, stream, n, ()))
        report("fixed columns", n, secs, base)
        secs, _ = timed(lambda: _ours(conn, stream, n, METADATA_FIELDS))
        report("all metadata", n, secs, base)


if __name__ == "__main__":
    main()
