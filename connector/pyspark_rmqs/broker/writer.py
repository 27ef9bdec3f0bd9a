"""The producer: one publisher per partition stream, behind a synchronous `send` / `flush`.

One publisher per partition stream, each on its own connection (rstream's super stream producer
misroutes key routing and hashes differently from the Java and Go clients; see DESIGN). Where each
message goes is `routing.py`; the bytes of each publish frame (at most `batch_size` messages and the
negotiated frame_max, sub-entry batches compressed) are `frames.py`; one publisher's ids, confirm
window and recovery are `publisher.py`. `send()` blocks while `max_in_flight` messages await
confirms (up to `enqueue_timeout_ms`), and raises at once when any earlier message failed;
`flush()` waits for every confirm (`confirm_timeout_ms`) and raises on any failure.

A lost connection (a broker restart) or a stream whose leader moved reconnects the publisher
(`recovery.retry_async`; the producer hands it a fresh pooled connection) and re-sends, in order and
with their publishing ids, the frames still awaiting a confirm (kept until confirmed: at most
`max_in_flight` messages). With a producer name the broker drops those it had already stored, so
nothing is duplicated; without one, the re-sent messages that had been stored before the connection
dropped appear twice (at-least-once). A deleted stream, or a broker that does not come back in
time, fails loudly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rstream import exceptions as rx

from pyspark_rmqs.broker import recovery
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.placement import connect_for
from pyspark_rmqs.broker.pool import get_pool
from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.broker.publisher import Publisher
from pyspark_rmqs.broker.publisher import WriteSettings as WriteSettings  # importable here, as before
from pyspark_rmqs.broker.recovery import PRODUCER_CLOSE_TIMEOUT_S, retry_async

# Importable here too, as before: tests and users patch or read them through this module.
from pyspark_rmqs.broker.recovery import RECOVERY_WINDOW_S as RECOVERY_WINDOW_S
from pyspark_rmqs.broker.routing import HASH_SEED as HASH_SEED
from pyspark_rmqs.broker.routing import Group, Router
from pyspark_rmqs.broker.routing import hash_partition as hash_partition
from pyspark_rmqs.broker.topology import Node, node_of
from pyspark_rmqs.core.errors import BrokerUnavailableError, PublishError, access_refused

log = logging.getLogger(__name__)


class StreamProducer:
    """Synchronous producer for a stream or a super stream (the sink's executor side)."""

    def __init__(
        self,
        conn: Any,
        target: str,
        *,
        superstream: bool,
        settings: WriteSettings,
        partitions: Sequence[str] | None = None,
    ) -> None:
        self.conn = conn
        self.target = target
        self.superstream = superstream
        self.s = settings
        self._publishers: dict[str, Publisher] = {}
        self._clients: list[RmqsClient] = []
        self.router = Router(
            conn,
            target,
            superstream=superstream,
            strategy=settings.routing_strategy,
            partitioner_class=settings.partitioner_class,
        )
        if partitions is not None:  # a Spark task: the partitions its job's driver saw
            self.router.pin(partitions, "this write job")
        self.messages = 0
        self._first_ids: dict[str, int] = {}
        self._skip: dict[str, int] = {}
        self._skipped: dict[str, int] = {}

    def number_from(self, first_ids: Mapping[str, int], skip: Mapping[str, int] | None = None) -> None:
        """Number each partition stream's messages from `first_ids[stream]` (with a producer name the
        broker drops those at or below its sequence: re-sent), after leaving out the first
        `skip[stream]` messages routed to it (stored before, under ids the sequence has passed).
        Call before the first `send`; streams not named continue after the broker's sequence."""
        self._first_ids = dict(first_ids)
        self._skip = {s: n for s, n in (skip or {}).items() if n > 0}

    def pin_partitions(self, partitions: Sequence[str], why: str) -> None:
        """Route over an earlier try's partition list, not today's (`Router.pin`). Before `send`."""
        self.router.pin(partitions, why)

    @property
    def partitions(self) -> list[str]:
        """The partition streams messages are routed over (today's, or those pinned)."""
        return list(self.router.partitions)

    def route(self, routing_key: str | None, row: int = -1) -> list[str]:
        """The partition stream(s) a message with `routing_key` goes to."""
        return self.router.route(routing_key, row)

    def send(
        self,
        messages: Sequence[bytes],
        routing_keys: Sequence[str | None] | None = None,
        filter_values: Sequence[str | None] | None = None,
    ) -> None:
        """Publish encoded messages in order (per partition stream); blocks on a full confirm window."""
        if not messages:
            return
        base = self.messages  # rows of earlier sends: errors number the rows of the whole task
        groups = self.router.group(messages, routing_keys, filter_values, base)
        run_sync(self._send(groups), None, "publish")
        self.messages += len(messages)

    async def _send(self, groups: dict[str, Group]) -> None:
        for stream, g in groups.items():
            left = self._skip.get(stream, 0) - self._skipped.get(stream, 0)
            if left > 0:
                k = min(left, len(g.messages))
                self._skipped[stream] = self._skipped.get(stream, 0) + k
                g = Group(g.messages[k:], None if g.filters is None else g.filters[k:], g.rows[k:])
                if not g.messages:
                    continue
            pub = await self._publisher(stream)
            await pub.publish(g.messages, g.filters, self.s, g.rows)

    async def _publisher(self, stream: str) -> Publisher:
        known = self._publishers.get(stream)
        if known is not None:
            return known

        first = self._first_ids.get(stream)

        async def start() -> tuple[RmqsClient, Publisher]:
            client = await connect_for(self.conn, stream, "write", "rmqs-writer")  # the leader
            try:
                pub = Publisher(
                    client,
                    stream,
                    0,
                    self.s.producer_name,
                    self.s.resume_sequence if first is None else False,
                    reconnect=functools.partial(self._reconnect, stream),
                    first_id=self.s.first_publishing_id if first is None else first,
                    id_limit=self.s.publishing_id_limit,
                )
                await pub.start()
            except rx.AccessRefused as e:  # declaring a publisher needs write on the stream
                await get_pool().discard(client)
                raise access_refused(self.conn, stream, "write") from e
            except Exception:
                await get_pool().discard(client)
                raise
            return client, pub

        def exhausted(err: BrokerUnavailableError) -> BaseException:
            return PublishError(
                f"could not start publishing to '{stream}': the broker did not come back within "
                f"{recovery.RECOVERY_WINDOW_S:.0f} s ({err}). {recovery.COME_BACK_ADVICE}"
            )

        # A task may start while the broker restarts: wait for it, as a recovery does.
        client, pub = await retry_async(f"publish to '{stream}'", start, exhausted=exhausted)
        self._clients.append(client)
        self._publishers[stream] = pub
        return pub

    async def _reconnect(self, stream: str, dead: RmqsClient) -> RmqsClient:
        """A new connection in place of `dead` (closed and forgotten), on the stream's leader as the
        metadata names it now (it may have moved)."""
        pool = get_pool()
        if dead in self._clients:
            self._clients.remove(dead)
            await pool.discard(dead)
        client = await connect_for(self.conn, stream, "write", "rmqs-writer")
        self._clients.append(client)
        return client

    def flush(self) -> None:
        """Wait for every confirm; raise when any message failed or stayed unconfirmed."""
        run_sync(self._flush(), None, "flush")

    async def _flush(self) -> None:
        timeout = self.s.confirm_timeout_ms / 1000
        await asyncio.gather(*(p.wait_all(timeout) for p in self._publishers.values()))
        for p in self._publishers.values():
            p.raise_failures()

    def message_counts(self) -> dict[str, int]:
        """Messages sent per partition stream (confirmed once `flush()` returned)."""
        return {s: p.sent for s, p in self._publishers.items()}

    def skipped_counts(self) -> dict[str, int]:
        """Messages left out per partition stream (`number_from`'s `skip`)."""
        return dict(self._skipped)

    def frame_stats(self) -> dict[str, tuple[int, int]]:
        """(publish frames sent, largest frame in bytes) per partition stream."""
        return {s: (p.frames, p.largest_frame) for s, p in self._publishers.items()}

    def nodes(self) -> dict[str, Node | None]:
        """The node each partition stream's publisher is connected to now, as the node advertises
        itself (the stream's leader, unless the cluster moved it since)."""
        return {s: node_of(p.client.server_properties) for s, p in self._publishers.items()}

    def last_publishing_ids(self) -> dict[str, int]:
        return {s: p.next_id - 1 for s, p in self._publishers.items()}

    def close(self) -> None:
        """Release the publishers and return their connections to the pool."""
        try:
            run_sync(self._close(), PRODUCER_CLOSE_TIMEOUT_S, "close producer")
        except Exception:
            log.debug("closing producer failed", exc_info=True)

    async def _close(self) -> None:
        unclean = set()
        for p in self._publishers.values():
            if not await p.close():
                unclean.add(id(p.client))
        pool = get_pool()
        for c in self._clients:
            if id(c) in unclean:
                await pool.discard(c)  # a publisher id may still be declared on it
            else:
                pool.release(self.conn, c)
        self._publishers.clear()
        self._clients.clear()

    def __enter__(self) -> StreamProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
