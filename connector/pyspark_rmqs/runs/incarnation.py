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

The decision (issue 42): every stream a watermark run plans is marked, **empty ones included**.
An unmarked empty stream used to match any recorded incarnation, so a stream deleted and created
again, then planned while still empty, inherited the old stream's record and had the consumer's old
watermark stored on it: the first messages of the new stream were never delivered. Marking an empty
stream costs one offset-tracking entry (its first message is then offset 1, not 0; readers skip
tracking entries) and happens once in a stream's life. And a marker never leaves a stream, so a
recorded marker never matches an unmarked stream (`same`): only a record written without a marker
(a backfill reads markers without writing one) matches any stream.
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
