"""Which incarnation of a stream a run read: an identity a deleted and re-created stream cannot share.

A run's token names its consumer and ranges; a stream deleted and created again under the same
name starts again at offset 0, so its new `[0, 500)` would carry an old commit's token and be
skipped as "already delivered". Kafka met the same problem and named topics by ID (KIP-516).

RabbitMQ has no stream ID in the stream protocol, so rmqs keeps one in the stream itself: a random
positive number stored as the offset of the tracking name `rmqs.incarnation` on each partition
stream. Stored offsets live in the stream's own log (carried across retention by the broker's
tracking snapshots), so they vanish with the stream: a re-created stream has none and gets a new
number. Two processes that mark a new stream at the same moment may both store; the last store
wins and both read it back, so every later reader agrees.

The decision (issue 42): a marker never leaves a stream, so **a recorded marker never matches an
unmarked stream** (`same`). An unmarked empty stream used to match any recorded incarnation, so a
stream deleted and created again, then planned while still empty, inherited the old stream's record
and had the consumer's old watermark stored on it: the first messages of the new stream were never
delivered. Now the old record does not apply there, and the consumer, which has run before, reads
the stream it has never seen from offset 0 (`plan._new_partitions`). Empty streams stay unmarked
until they hold a message: a marker is an offset-tracking entry, and on brokers before 4.3 a stream
holding only tracking entries costs every tail lookup a 1.5 s probe (`client.PROBE_TIMEOUT_S`: the
last user chunk is proven absent by silence). Only a record written without a marker (planned on
an empty stream) matches any stream, and its ranges there are empty.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable

from pyspark_rmqs.broker.client import AsyncBrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.recovery import WATERMARKS_TIMEOUT_S

REFERENCE = "rmqs.incarnation"
UNMARKED = 0  # no marker yet: only a run that stores offsets marks a stream


def same(recorded: int, now: int) -> bool:
    """Whether a stream recorded as `recorded` may be the stream that is `now`.

    Equal markers, or nothing recorded (a record or commit written before its stream was marked).
    A recorded marker against an unmarked stream is another stream: markers are never removed, so
    the recorded stream was deleted and this one created since.
    """
    return recorded in (now, UNMARKED)


async def _one(client: AsyncBrokerClient, stream: str, mark: bool) -> int:
    found = await client.stored_offset(REFERENCE, stream)
    if found is not None:
        return found
    if not mark:
        return UNMARKED
    if (await client.stats(stream)).is_empty:
        # Marked once it holds a message: a marker alone would cost tail lookups a probe (above).
        return UNMARKED
    new = secrets.randbelow(2**62) + 1
    await client.store_offset_unconfirmed(REFERENCE, stream, new)
    for _ in range(100):  # StoreOffset has no reply: read until a value (ours or a racer's) shows
        found = await client.stored_offset(REFERENCE, stream)
        if found is not None:
            return found
        await asyncio.sleep(0.02)
    return new


async def aincarnations(conn: object, streams: Iterable[str], *, mark: bool = True) -> dict[str, int]:
    """The incarnation of each partition stream, marking streams that have none yet (`mark`: runs
    that store offsets anyway; a backfill or a peek only reads the markers, it writes nothing into
    the streams it reads)."""
    client = AsyncBrokerClient(conn)
    names = list(streams)
    sem = asyncio.Semaphore(16)

    async def bounded(s: str) -> int:
        async with sem:
            return await _one(client, s, mark)

    return dict(zip(names, await asyncio.gather(*(bounded(s) for s in names)), strict=True))


def incarnations(conn: object, streams: Iterable[str], *, mark: bool = True) -> dict[str, int]:
    return run_sync(aincarnations(conn, streams, mark=mark), WATERMARKS_TIMEOUT_S, "incarnations")
