"""`StreamsHandle`: the calls an orchestrator's handle on the broker offers, written once.

Airflow's `RabbitMQStreamHook` and Dagster's `RabbitMQStreamsResource` both derive from it, so a
user moving between orchestrators types the same calls and gets the same values back: watermarks
(`watermarks`, `tails`, `stored_offsets`, `lag` (total), `lags` (per partition stream),
`store_watermarks`, and `a...` twins for an event loop), stream management (`create_stream`,
`delete_stream`, `create_super_stream`, `delete_super_stream`), `publish`, `read_batches` and
`spark_options`. Each side says only where its connection comes from: `_connection()` (sync, in the
caller's thread) and `_aconnection()` (on the caller's event loop: the Airflow triggerer must not
block), and how long one sync metadata call may take (`_metadata_timeout_s()`).

Everything here is metadata over the stream protocol, except `publish` and `read_batches`: no
message is consumed, no JVM is started. pyspark is never imported, and pyarrow only inside
`publish` and `read_batches`, so sensors and triggers can use a handle freely.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.recovery import WATERMARKS_TIMEOUT_S
from pyspark_rmqs.options import ConnectionOptions, SourceOptions
from pyspark_rmqs.runs.watermarks import Watermarks, astore_watermarks, awatermarks, store_watermarks

if TYPE_CHECKING:
    import pyarrow as pa


class StreamsHandle(ABC):
    """The shared calls of the Airflow hook and the Dagster resource (no fields, no state)."""

    # ------------------------------------------------------------------ what each side provides

    @abstractmethod
    def _connection(self) -> ConnectionOptions:
        """The parsed connection, looked up in the caller's thread."""

    @abstractmethod
    async def _aconnection(self) -> ConnectionOptions:
        """The parsed connection, looked up without blocking the caller's event loop."""

    def _metadata_timeout_s(self) -> float:
        """The bound on one sync metadata call (`watermarks` and what derives from it)."""
        return WATERMARKS_TIMEOUT_S

    # ------------------------------------------------------------------ watermarks (sync)

    def watermarks(
        self,
        consumer_name: str,
        *,
        stream: str | None = None,
        superstream: str | None = None,
        polling: bool = False,
    ) -> Watermarks:
        """First offset, tail, stored watermark and lag of `consumer_name` per partition stream.

        `polling` (for checks that poll: sensors, triggers) reuses a tail, and a stored offset,
        that this process read at the stream's current chunk ids: no chunk (message or offset
        store) was written since, so they did not change (see `pyspark_rmqs.broker.lookups`)."""
        poll = {"polling": True} if polling else {}
        coro = awatermarks(self._connection(), consumer_name, stream=stream, superstream=superstream, **poll)
        return run_sync(coro, self._metadata_timeout_s(), f"watermarks of '{superstream or stream}'")

    def tails(self, *, stream: str | None = None, superstream: str | None = None) -> dict[str, int]:
        """The next offset to be written, per partition stream."""
        return self.watermarks("", stream=stream, superstream=superstream).tails()

    def stored_offsets(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int | None]:
        """The broker-stored offset (the watermark) of `consumer_name` per partition stream; None if none."""
        return self.watermarks(consumer_name, stream=stream, superstream=superstream).stored_offsets()

    def lag(self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None) -> int:
        """Offsets after `consumer_name`'s watermark, summed over partition streams: the messages
        published since, plus the few offset-tracking entries written after it (docs/semantics.md)."""
        return self.watermarks(consumer_name, stream=stream, superstream=superstream).total_lag

    def lags(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int]:
        """Offsets after `consumer_name`'s watermark (messages and tracking entries), per partition stream."""
        return self.watermarks(consumer_name, stream=stream, superstream=superstream).lags()

    def store_watermarks(self, consumer_name: str, last_offsets: Mapping[str, int]) -> None:
        """Store the watermarks (last processed offset per stream): only after a sink succeeded."""
        store_watermarks(self._connection(), consumer_name, last_offsets)

    # ------------------------------------------------------------------ watermarks (async)

    async def awatermarks(
        self,
        consumer_name: str,
        *,
        stream: str | None = None,
        superstream: str | None = None,
        polling: bool = False,
    ) -> Watermarks:
        """`watermarks` on the caller's event loop (an Airflow trigger, async Dagster code); not
        bounded by the metadata timeout: bound it there if needed, e.g. with `asyncio.timeout`."""
        conn = await self._aconnection()
        poll = {"polling": True} if polling else {}
        return await awatermarks(conn, consumer_name, stream=stream, superstream=superstream, **poll)

    async def atails(self, *, stream: str | None = None, superstream: str | None = None) -> dict[str, int]:
        """`tails` on the caller's event loop."""
        return (await self.awatermarks("", stream=stream, superstream=superstream)).tails()

    async def astored_offsets(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int | None]:
        """`stored_offsets` on the caller's event loop."""
        w = await self.awatermarks(consumer_name, stream=stream, superstream=superstream)
        return w.stored_offsets()

    async def alag(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> int:
        """`lag` on the caller's event loop."""
        return (await self.awatermarks(consumer_name, stream=stream, superstream=superstream)).total_lag

    async def alags(
        self, consumer_name: str, *, stream: str | None = None, superstream: str | None = None
    ) -> dict[str, int]:
        """`lags` on the caller's event loop."""
        return (await self.awatermarks(consumer_name, stream=stream, superstream=superstream)).lags()

    async def astore_watermarks(self, consumer_name: str, last_offsets: Mapping[str, int]) -> None:
        """`store_watermarks` on the caller's event loop."""
        await astore_watermarks(await self._aconnection(), consumer_name, last_offsets)

    # ------------------------------------------------------------------ streams and messages

    def create_stream(self, stream: str, arguments: Mapping[str, Any] | None = None) -> None:
        """Create a stream (`arguments` such as `max-length-bytes`); an existing one is left as it is."""
        BrokerClient(self._connection()).create_stream(stream, arguments)

    def delete_stream(self, stream: str) -> None:
        """Delete a stream and its messages; a missing one is not an error."""
        BrokerClient(self._connection()).delete_stream(stream)

    def create_super_stream(
        self, superstream: str, partitions: int, arguments: Mapping[str, Any] | None = None
    ) -> None:
        """Create a super stream with partitions `<name>-0` .. `<name>-(N-1)` (binding keys "0".."N-1")."""
        BrokerClient(self._connection()).create_super_stream(superstream, partitions, arguments)

    def delete_super_stream(self, superstream: str) -> None:
        """Delete a super stream and its partition streams; a missing one is not an error."""
        BrokerClient(self._connection()).delete_super_stream(superstream)

    def publish(
        self,
        messages: Iterable[Any],
        *,
        stream: str | None = None,
        superstream: str | None = None,
        producer_name: str | None = None,
        routing_strategy: str = "hash",
        run_identity: str | None = None,
    ) -> dict[str, int]:
        """Publish `bytes` / `str` / dict messages (`pyspark_rmqs.runs.produce`) and wait for every confirm.

        With `producer_name` the call is a produce run: a second run of the name on the same stream
        or super stream fails with `ProducerBusyError` before it sends, and a retry with the same
        `run_identity` (the same messages, in the same order) adds only what its failed try did not
        get stored. Without `run_identity` every call is a new run; without `producer_name` nothing
        is deduplicated. Returns the messages published per partition stream.
        """
        from pyspark_rmqs.broker.writer import WriteSettings
        from pyspark_rmqs.runs import produce

        settings = WriteSettings(producer_name=producer_name, routing_strategy=routing_strategy)
        return produce.publish(
            self._connection(),
            messages,
            stream=stream,
            superstream=superstream,
            settings=settings,
            run_identity=run_identity,
        )

    def read_batches(
        self,
        stream: str,
        start: int,
        end: int,
        *,
        metadata_fields: Iterable[str] = (),
        queue_capacity: int = SourceOptions.default("queue_capacity"),
        fail_on_data_loss: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """Offsets `[start, end)` of one (partition) stream as Arrow RecordBatches of the source schema.

        Memory is bounded by `queue_capacity`; the watermark is not touched (Airflow's
        `RabbitMQStreamConsumeOperator` and Dagster's `engine="arrow"` assets read and advance it).
        """
        from pyspark_rmqs.broker.reader import RangeReader, ReadSettings

        settings = ReadSettings(
            metadata_fields=tuple(metadata_fields),
            queue_capacity=queue_capacity,
            fail_on_data_loss=fail_on_data_loss,
        )
        yield from RangeReader(self._connection(), stream, start, end, settings)

    def spark_options(
        self, *, stream: str | None = None, superstream: str | None = None, **extra: str
    ) -> dict[str, str]:
        """`spark.read/write.format("rabbitmq_streams")` options: the connection, the stream or super
        stream if given, and `extra`. They hold the password: never log them."""
        target = {"stream": stream, "superstream": superstream}
        return {
            **self._connection().to_options(),
            **{k: v for k, v in target.items() if v is not None},
            **extra,
        }
