"""Finding a consumer's latest run record in `rmqs.runs` after 1, 1,000 and 10,000 runs of others.

    .venv/bin/python -m bench.runs_stream [--histories 1,1000,10000] [--rounds 5]

`rmqs.runs` holds one record per run step of every consumer of a virtual host; a run starts by
finding its consumer's newest record (`record.latest`: the consumer's stored pointer, then the first
of its records at or after it). At each size H the stream holds the consumer's record followed by H
records of other consumers (the worst case for a consumer that runs rarely among many that run
often: every record after its pointer is someone else's), written as `record.write_body` writes
them (each published, each with its own pointer stored). Then `latest_body` is timed (median of
`--rounds`, 11). The stream is a temporary one standing for `rmqs.runs` (`record.RUNS_STREAM` patched in
this process), so the bench leaves the virtual host's own stream alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

from bench.common import connection
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode_body
from pyspark_rmqs.runs import record


def _body(consumer: str, i: int) -> bytes:
    """A record of the size runs write (one stream, a token, the states' fields)."""
    return json.dumps(
        {"consumer": consumer, "target": "orders", "state": "stored", "ranges": {"orders": [i, i + 10]},
         "incarnations": {"orders": 1}, "seen": {"orders": i - 1}, "token": uuid.uuid4().hex[:20],
         "run_id": uuid.uuid4().hex, "superstream": False, "pipeline": None, "attempt": 0,
         "started_at": time.time(), "updated_at": time.time(), "v": 1},
        sort_keys=True, separators=(",", ":"),
    ).encode()  # fmt: skip


def _others(conn: object, count: int) -> None:
    """`count` records of other consumers, published one at a time as runs publish them (their
    pointers are theirs: not stored, they change nothing of the lookup measured)."""
    with StreamProducer(conn, record.RUNS_STREAM, superstream=False, settings=WriteSettings()) as p:
        for i in range(count):
            p.send([encode_body(_body(f"other-{i % 50}", i))])
            p.flush()  # one record per chunk, as each run's write publishes it


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--histories", default="1,1000,10000")
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    conn = connection()
    record.RUNS_STREAM = f"bench-rmqs-runs-{uuid.uuid4().hex[:8]}"
    client = BrokerClient(conn)
    record.ensure_stream(conn)
    first = None
    try:
        for size in (int(x) for x in args.histories.split(",")):
            consumer = f"bench-{uuid.uuid4().hex[:8]}"
            key = record.run_key(consumer, "orders")
            match = record._is_record_of(consumer, "orders")
            record.write_body(conn, key, _body(consumer, 0))
            _others(conn, size)
            took = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                assert record.latest_body(conn, key, match) is not None
                took.append(time.perf_counter() - t0)
            median = statistics.median(took)
            first = first or median
            tail = client.tail(record.RUNS_STREAM)
            print(
                f"rmqs.runs, the consumer's record then {size:,} records of others (stream tail {tail:,}): "
                f"latest {median * 1000:.1f} ms ({median / first:.2f}x)",
                flush=True,
            )
    finally:
        client.delete_stream(record.RUNS_STREAM)


if __name__ == "__main__":
    main()
