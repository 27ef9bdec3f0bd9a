"""Writer throughput against a bare rstream producer, in one run against the same broker.

    .venv/bin/python -m bench.writer [--messages N] [--rounds 3]

Both sides publish the same N pre-built messages (100-byte bodies in one AMQP data section) to a
fresh stream each and stop the clock when the last confirm arrives; publisher setup is excluded
(one warm-up message, confirmed, before the clock starts); each side the best of `--rounds`
interleaved rounds (bench.common.best_measured). Prints one line per side, with the ratio to
the bare producer and the local broker's CPU seconds over that side's best timed span:
`writer: ... 1.05x; broker CPU 2.05 s`.

A third side publishes the same messages with `subEntrySize=100` (opt-in: one sub-entry of 100
messages per publishing id, so the broker handles a hundredth of the entries; deduplication is not
guaranteed then). The broker's CPU per message is the same for both producers with one entry per
message: where it is close to the bare producer's whole time, that is the ceiling any client meets
on this machine, and the last line says so: `broker-bound: ...`.
"""

from __future__ import annotations

import argparse
import asyncio

from rstream import Producer, RawMessage
from rstream.producer import ConfirmationStatus

from bench.common import ROUNDS, Measured, Span, best_measured, broker_bound, connection, report, temp_stream
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode
from pyspark_rmqs.options import ConnectionOptions

BODY = b"x" * 100
BARE_BATCH = 5_000  # messages per rstream send_batch: one publish frame each (~585 KB < frame_max)
OUR_BATCH = 10_000  # messages per StreamProducer.send()
SUB_ENTRY_SIZE = 100  # the opt-in side's messages per sub-entry


async def _bare(conn: ConnectionOptions, stream: str, count: int) -> Measured:
    """rstream's own producer: send_batch with a confirm callback; measured from the first send to
    the last confirm."""
    host, port = conn.addresses()[0]
    messages = [RawMessage(encode(BODY)) for _ in range(count)]  # distinct: rstream sets publishing_id
    confirmed = 0
    failed = 0
    target = 1
    done = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed, failed
        if status.is_confirmed:
            confirmed += 1
        else:
            failed += 1
        if confirmed + failed >= target:
            done.set()

    async with Producer(
        host, port, username=conn.username, password=conn.password.get_secret_value(), vhost=conn.vhost
    ) as p:
        # warm-up: connect to the leader and declare the publisher outside the clock
        await p.send_batch(stream, [RawMessage(encode(BODY))], on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 60)
        confirmed, failed, target = 0, 0, count
        done.clear()
        span = Span()
        for i in range(0, count, BARE_BATCH):
            await p.send_batch(stream, messages[i : i + BARE_BATCH], on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 600)
        measured = span.done()
    assert failed == 0 and confirmed == count, (confirmed, failed, count)
    return measured


def bare_round(conn: ConnectionOptions, count: int) -> Measured:
    """One round of the bare producer on a fresh stream (the baseline of bench.spark_write too)."""
    with temp_stream(conn, "bench-writer-bare") as stream:
        return asyncio.run(_bare(conn, stream, count))


def _ours(
    conn: ConnectionOptions, stream: str, count: int, settings: WriteSettings | None = None
) -> Measured:
    """`StreamProducer.send()` in batches of 10,000, then `flush()`; measured from first send to flush."""
    messages = [encode(BODY) for _ in range(count)]
    with StreamProducer(conn, stream, superstream=False, settings=settings or WriteSettings()) as p:
        p.send([encode(BODY)])  # warm-up: pool connection and publisher declaration outside the clock
        p.flush()
        span = Span()
        for i in range(0, count, OUR_BATCH):
            p.send(messages[i : i + OUR_BATCH])
        p.flush()
        measured = span.done()
        assert p.messages == count + 1, (p.messages, count)
    return measured


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="best of this many interleaved rounds")
    args = ap.parse_args()
    n = args.messages
    conn = connection()

    def bare(_round: int) -> Measured:
        return bare_round(conn, n)

    def ours(_round: int) -> Measured:
        with temp_stream(conn, "bench-writer") as stream:
            return _ours(conn, stream, n)

    def sub_entries(_round: int) -> Measured:
        with temp_stream(conn, "bench-writer-sub") as stream:
            return _ours(conn, stream, n, WriteSettings(sub_entry_size=SUB_ENTRY_SIZE))

    cpu: dict[str, float] = {}
    best = best_measured(args.rounds, {"bare": bare, "ours": ours, "sub": sub_entries}, cpu)
    base = report("bare rstream producer", n, best["bare"], broker_cpu=cpu.get("bare"))
    report("writer", n, best["ours"], base, cpu.get("ours"))
    report(f"writer, subEntrySize={SUB_ENTRY_SIZE} (opt-in)", n, best["sub"], base, cpu.get("sub"))
    broker_bound(n, best["bare"], cpu.get("ours"))


if __name__ == "__main__":
    main()
