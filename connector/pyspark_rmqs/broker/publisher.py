"""One publisher on one partition stream: publishing ids, the confirm window, re-send on reconnect.

`Publisher` is what `StreamProducer` (writer.py) runs per partition stream, on the broker loop. It
numbers messages with publishing ids (continuing after the broker's last id for its producer name,
or from a given first id), packs them into publish frames (`frames.py`: at most `batch_size`
messages and the negotiated frame_max, sub-entry batches compressed), keeps every frame until the
broker confirmed it, and waits while `max_in_flight` messages await confirms.

A lost connection (a broker restart) or a stream whose leader moved reconnects the publisher
(`recovery.retry_async`, through the producer's `reconnect`), declares it again and re-sends, in
order and with their publishing ids, the frames still awaiting a confirm. A deleted stream, a broker
that does not come back within `recovery.RECOVERY_WINDOW_S`, or recoveries that never see a confirm
fail with `PublishError`. `WriteSettings` (the producer's settings) is defined here because both
the publisher and the producer read it; writer.py re-exports it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rstream import exceptions as rx
from rstream import schema

from pyspark_rmqs.broker import frames, recovery
from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.broker.recovery import as_transient, retry_async
from pyspark_rmqs.core.errors import (
    BrokerTimeoutError,
    BrokerUnavailableError,
    DataError,
    PublishError,
    StreamNotFoundError,
)
from pyspark_rmqs.options import SinkOptions

log = logging.getLogger("pyspark_rmqs.broker.writer")  # the producer's logger, as before the split

_MAX_STALLED_RECOVERIES = 5

RESPONSE_CODES = {
    2: "stream does not exist",
    6: "stream not available",
    16: "access refused",
    17: "precondition failed",
    18: "publisher does not exist",
}


@dataclass
class WriteSettings:
    """What a producer needs; the Spark sink builds it from `SinkOptions.writer_settings()`."""

    # Option defaults come from the option table (pyspark_rmqs.options): declared once, there.
    producer_name: str | None = None
    confirm_timeout_ms: int = SinkOptions.default("publisher_confirm_timeout_ms")
    max_in_flight: int = SinkOptions.default("max_in_flight")
    enqueue_timeout_ms: int = SinkOptions.default("enqueue_timeout_ms")
    batch_size: int = SinkOptions.default("batch_size")
    compression: str = SinkOptions.default("compression")
    sub_entry_size: int = SinkOptions.default("sub_entry_size")
    routing_strategy: str = SinkOptions.default("routing_strategy")
    partitioner_class: str | None = None
    # With a producer name: True continues after the broker's last publishing id (a new batch of
    # data); False numbers messages first_publishing_id, +1, ... per stream, so re-sending the same
    # rows under the same name is deduplicated by the broker (the Spark sink's mode, whose names
    # are unique per job or per streaming query: see spark/sink.py). A produce run numbers each
    # partition stream from its own recorded base instead (`StreamProducer.number_from`,
    # `runs.producer`).
    resume_sequence: bool = True
    first_publishing_id: int = 1
    # Publishing ids must stay below this (exclusive); a streaming epoch owns [e << 32, (e+1) << 32).
    publishing_id_limit: int | None = None


class Publisher:
    """One publisher on one partition stream; runs on the broker loop."""

    def __init__(
        self,
        client: RmqsClient,
        stream: str,
        publisher_id: int,
        name: str | None,
        resume: bool = True,
        reconnect: Callable[[RmqsClient], Awaitable[RmqsClient]] | None = None,
        first_id: int = 1,
        id_limit: int | None = None,
    ) -> None:
        self.client = client
        self.stream = stream
        self.id = publisher_id
        self.name = name
        self.resume = resume
        self.reconnect = reconnect  # a fresh connection in place of a dead one (None: fail instead)
        self.next_id = first_id
        self.id_limit = id_limit
        self.frames = 0
        self.largest_frame = 0
        self.in_flight = 0
        self.sent = 0
        self.confirmed = 0
        self.stalled_recoveries = 0  # recoveries in a row with no confirm in between
        self._confirmed_at_recovery = -1
        self.failures: list[tuple[int, int]] = []
        self.gone: str | None = None
        self.changed = asyncio.Condition()
        # (last publishing id, confirms expected, frame) of frames not yet fully confirmed, in order.
        self.unconfirmed: deque[tuple[int, int, bytes]] = deque()
        self.max_confirmed = 0

    async def start(self) -> None:
        await self._attach()
        if self.name and self.resume:
            # Continue after the last publishing id the broker kept for this name.
            self.next_id = await self.client.query_publisher_sequence(self.stream, self.name) + 1

    async def _attach(self) -> None:
        self.client.confirm_sinks[self.id] = self._on_confirm
        self.client.add_handler(schema.PublishError, self._on_error, name=f"rmqs-pub-{self.id}")
        self.client.add_handler(schema.MetadataUpdate, self._on_metadata, name=f"rmqs-pub-{self.id}")
        self.client.on_closed[f"rmqs-pub-{self.id}"] = self._on_closed
        try:
            await self.client.declare_publisher(self.stream, self.name, self.id)
        except rx.StreamDoesNotExist as e:
            raise StreamNotFoundError(f"stream '{self.stream}' does not exist") from e

    def _detach(self) -> None:
        self.client.confirm_sinks.pop(self.id, None)
        self.client.remove_handler(schema.PublishError, f"rmqs-pub-{self.id}")
        self.client.remove_handler(schema.MetadataUpdate, f"rmqs-pub-{self.id}")
        self.client.on_closed.pop(f"rmqs-pub-{self.id}", None)

    @property
    def broken(self) -> bool:
        return self.gone is not None or not self.client.is_connection_alive()

    async def recover(self) -> None:
        """Reconnect, declare the publisher again and re-send every unconfirmed frame, in order."""
        reason = self.gone or "connection to the broker lost"
        unconfirmed = sum(n for _, n, _ in self.unconfirmed)
        if self.reconnect is None:
            raise PublishError(
                f"{reason} publishing to '{self.stream}' with {unconfirmed} message(s) unconfirmed"
            )
        self.stalled_recoveries = (
            self.stalled_recoveries + 1 if self.confirmed == self._confirmed_at_recovery else 1
        )
        self._confirmed_at_recovery = self.confirmed
        if self.stalled_recoveries > _MAX_STALLED_RECOVERIES:
            raise PublishError(
                f"{reason} publishing to '{self.stream}' {_MAX_STALLED_RECOVERIES} times in a row without "
                f"a single confirm in between: {unconfirmed} message(s) unconfirmed"
            )
        log.warning("%s publishing to '%s' (%d unconfirmed); reconnecting", reason, self.stream, unconfirmed)

        async def attach() -> None:
            assert self.reconnect is not None
            self._detach()
            self.client = await self.reconnect(self.client)
            self.gone = None
            await self._attach()

        def exhausted(err: BrokerUnavailableError) -> BaseException:
            return PublishError(
                f"{reason} publishing to '{self.stream}' and the broker did not come back within "
                f"{recovery.RECOVERY_WINDOW_S:.0f} s: {unconfirmed} message(s) unconfirmed ({err})"
            )

        try:
            await retry_async(f"publish to '{self.stream}'", attach, exhausted=exhausted)
        except StreamNotFoundError as e:
            raise PublishError(
                f"stream '{self.stream}' no longer exists: {unconfirmed} message(s) unconfirmed"
            ) from e
        except PublishError:
            raise
        except Exception as e:  # not transient: fail as a publish error too
            raise PublishError(
                f"{reason} publishing to '{self.stream}' and the broker did not come back within "
                f"{recovery.RECOVERY_WINDOW_S:.0f} s: {unconfirmed} message(s) unconfirmed ({e})"
            ) from e
        self.in_flight = unconfirmed
        try:
            for _, _, frame in list(self.unconfirmed):
                await self.client.send_raw(frame)
        except Exception as e:  # lost again: the caller's next check of `broken` recovers once more
            if as_transient(e) is None:
                raise
            return
        log.warning(
            "reconnected to '%s'; re-sent %d unconfirmed message(s)%s",
            self.stream,
            unconfirmed,
            " (the broker drops those it had stored: producer name)"
            if self.name
            else " (those the broker had stored appear twice: no producer name)",
        )

    def _on_confirm(self, ids: tuple[int, ...]) -> None:
        self.in_flight -= len(ids)
        self.confirmed += len(ids)
        # A publisher's confirms arrive in publishing-id order: frames up to the highest are done.
        self.max_confirmed = max(self.max_confirmed, max(ids, default=0))
        while self.unconfirmed and self.unconfirmed[0][0] <= self.max_confirmed:
            self.unconfirmed.popleft()
        asyncio.get_running_loop().create_task(self._notify())

    def _on_error(self, frame: schema.PublishError) -> None:
        if frame.publisher_id != self.id:
            return
        for err in frame.errors:
            self.failures.append((err.publishing_id, err.response_code))
        self.in_flight -= len(frame.errors)
        asyncio.get_running_loop().create_task(self._notify())

    def _on_metadata(self, frame: schema.MetadataUpdate) -> None:
        """The broker says the stream went away (deleted, restarted, or its leader moved): recover."""
        if frame.metadata_info.stream == self.stream:
            self.gone = (
                f"the broker reported stream '{self.stream}' unavailable (code {frame.metadata_info.code})"
            )
            asyncio.get_running_loop().create_task(self._notify())

    def _on_closed(self) -> None:
        """The connection is gone (a node killed, say): wake the waiters, which then recover."""
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def raise_failures(self) -> None:
        if self.failures:
            pid, code = self.failures[0]
            reason = RESPONSE_CODES.get(code, f"response code {code}")
            raise PublishError(
                f"the broker rejected {len(self.failures)} message(s) published to '{self.stream}' "
                f"(first: publishing id {pid}, {reason})"
            )

    async def wait_window(self, room: int, max_in_flight: int, timeout_s: float) -> None:
        """Wait until `room` more messages fit in the confirm window (recovering a lost connection)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            while True:
                if self.broken:
                    await self.recover()
                if self.in_flight + room <= max_in_flight or self.in_flight <= 0 or self.failures:
                    return
                async with self.changed:
                    await asyncio.wait_for(
                        self.changed.wait_for(
                            lambda: (
                                self.in_flight + room <= max_in_flight or bool(self.failures) or self.broken
                            )
                        ),
                        max(0.0, deadline - asyncio.get_running_loop().time()),
                    )
        except TimeoutError as e:
            raise BrokerTimeoutError(
                f"{self.in_flight} messages to '{self.stream}' still unconfirmed after enqueueTimeoutMs="
                f"{int(timeout_s * 1000)}; raise maxInFlight or check the broker"
            ) from e

    async def wait_all(self, timeout_s: float) -> None:
        """Wait for every confirm; a lost connection is recovered and its frames re-sent first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.failures:
                break
            if self.in_flight <= 0:
                return
            if self.broken:
                await self.recover()
                deadline = max(deadline, loop.time() + timeout_s / 2)  # the re-sent frames need time too
                continue
            try:
                async with self.changed:
                    await asyncio.wait_for(
                        self.changed.wait_for(lambda: self.in_flight <= 0 or self.failures or self.broken),
                        max(0.0, deadline - loop.time()),
                    )
            except TimeoutError as e:
                raise PublishError(
                    f"{self.in_flight} of {self.sent} messages to '{self.stream}' were not confirmed within "
                    f"publisherConfirmTimeoutMs={int(timeout_s * 1000)}: the leader confirms a message "
                    "once a majority of the stream's members stored it (a cluster that lost its "
                    f"majority confirms nothing). {recovery.COME_BACK_ADVICE}; with producerName a "
                    "retry re-sends only what the broker did not store"
                ) from e
        self.raise_failures()

    @property
    def frame_limit(self) -> int:
        """The largest publish frame, in bytes: the frame_max this connection negotiated."""
        return int(self.client.frame_max)

    async def publish(
        self,
        messages: Sequence[bytes],
        filters: Sequence[str | None] | None,
        s: WriteSettings,
        rows: Sequence[int] | None = None,
    ) -> None:
        """Publish in order, in frames of at most `batch_size` entries and `frame_limit` bytes.

        `rows` numbers the messages for errors (default: their positions).
        """
        rows = rows if rows is not None else range(len(messages))
        if s.sub_entry_size > 1:
            await self._publish_sub_entries(messages, rows, s)
            return
        sizes = frames.entry_sizes(messages, filters)
        for start, end in frames.plan_frames(sizes, s.batch_size, self.frame_limit - frames.FRAME_HEADER):
            if end - start == 1:
                frames.check_fits(
                    self.client,
                    self.stream,
                    sizes[start],
                    rows[start],
                    f"a message of {len(messages[start])} bytes",
                )
            part = messages[start:end]
            fpart = filters[start:end] if filters is not None else None
            await self._before_frame(len(part), s)
            frame = frames.publish_frame(self.id, self.next_id, part, fpart)
            self.next_id += len(part)
            await self._send_frame(frame, len(part), len(part))

    async def _publish_sub_entries(
        self, messages: Sequence[bytes], rows: Sequence[int], s: WriteSettings
    ) -> None:
        """Sub-entry batches: `sub_entry_size` messages per entry, compressed together; one confirm each."""
        entries = frames.sub_entries(messages, s.sub_entry_size, s.compression)
        sizes = frames.sub_entry_sizes(entries)
        first_row = [rows[j] for j in range(0, len(messages), s.sub_entry_size)]
        for start, end in frames.plan_frames(sizes, s.batch_size, self.frame_limit - frames.FRAME_HEADER):
            if end - start == 1:
                entry, n = entries[start]
                what = f"a sub-entry batch of {n} messages ({len(entry)} bytes) starting at this row"
                frames.check_fits(self.client, self.stream, sizes[start], first_row[start], what)
            part = entries[start:end]
            n = sum(k for _, k in part)
            await self._before_frame(n, s)
            frame = frames.sub_entry_frame(self.id, self.next_id, [e for e, _ in part])
            self.next_id += len(part)
            await self._send_frame(frame, len(part), n)

    async def _before_frame(self, messages: int, s: WriteSettings) -> None:
        """Wait for room in the confirm window; fail first if anything failed already."""
        self.raise_failures()
        await self.wait_window(messages, s.max_in_flight, s.enqueue_timeout_ms / 1000)
        self.raise_failures()

    async def _send_frame(self, frame: bytes, confirms: int, messages: int) -> None:
        """Send a built frame, keeping it until confirmed (a lost connection re-sends it)."""
        self._check_id_limit()
        self.in_flight += confirms
        self.sent += messages
        self.frames += 1
        self.largest_frame = max(self.largest_frame, len(frame))
        self.unconfirmed.append((self.next_id - 1, confirms, frame))
        try:
            await self.client.send_raw(frame)
        except Exception as e:  # the frame is kept: the next wait recovers and re-sends it
            if as_transient(e) is None:
                raise
            log.debug("send to '%s' failed: %s", self.stream, e)

    def _check_id_limit(self) -> None:
        """Publishing ids at or past the limit belong to the next epoch's range: fail instead."""
        if self.id_limit is not None and self.next_id - 1 >= self.id_limit:
            raise DataError(
                f"one task's messages to '{self.stream}' in one streaming epoch exceed 2^32: with "
                "producerName each epoch numbers its messages in a range of 2^32 publishing ids, and more "
                "would run into the next epoch's; use smaller micro-batches (maxRecordsPerTrigger) or "
                "more partitions"
            )

    async def close(self) -> bool:
        """Delete the publisher; True when the broker confirmed it, so its connection can be reused.

        A connection whose publisher id is still declared on the broker must not go back to the pool:
        the next writer to get it declares the same id and the broker refuses with
        PRECONDITION_FAILED (seen on a loaded machine, where the deletion timed out).
        """
        self._detach()
        if not self.client.is_connection_alive():
            return False
        try:
            await asyncio.wait_for(self.client.delete_publisher(self.id), 10)
        except Exception:
            log.debug("delete_publisher failed", exc_info=True)
            return False
        return True
