"""The write options' table (`SinkOptions`), their cross-option rules, and how they are parsed."""

from __future__ import annotations

from typing import Any, Literal, Self, get_args

from pydantic import field_validator, model_validator

from pyspark_rmqs.core.schema import PROPERTY_NAMES
from pyspark_rmqs.options.connection import ConnectionOptions, connection_from
from pyspark_rmqs.options.fields import DAY_MS, Reader, build, err, option, show
from pyspark_rmqs.options.source import TargetOptions, check_target

CompressionKind = Literal["none", "gzip", "snappy", "lz4", "zstd"]
RoutingStrategyKind = Literal["hash", "key", "custom"]
COMPRESSION_VALUES: tuple[str, ...] = get_args(CompressionKind)
ROUTING_STRATEGY_VALUES: tuple[str, ...] = get_args(RoutingStrategyKind)


class SinkOptions(TargetOptions):
    """Options of a batch (`df.write`) or streaming (`df.writeStream`) write."""

    connection: ConnectionOptions
    stream: str | None = option(
        "stream", None, "the stream to write; exactly one of `stream` / `superstream`"
    )
    superstream: str | None = option(
        "superstream", None, "the super stream to write (routed by `routingStrategy`)", broker="3.11+"
    )
    producer_name: str | None = option(
        "producerName",
        None,
        "deduplication of re-sent messages (a retried task, a replayed streaming epoch, a reconnection); "
        "never of another job's or checkpoint's rows. Tasks publish as "
        "`producerName-<job token>-p<partition>` "
        "(streaming: `-<query id>-p<partition>`, ids from `epoch << 32`); at most 227 bytes. See "
        "[Spark guide](spark.md#deduplication-producername)",
        kind="reference",
    )
    # waits: a day without a confirm is a stuck write, not a slow one
    publisher_confirm_timeout_ms: int = option(
        "publisherConfirmTimeoutMs", 30000, "a task fails when confirms take longer", ge=1, le=DAY_MS
    )
    # memory per producer: messages awaiting a confirm
    max_in_flight: int = option(
        "maxInFlight",
        10000,
        "unconfirmed messages per producer before `write` waits",
        ge=1,
        le=1_000_000,
    )
    enqueue_timeout_ms: int = option(
        "enqueueTimeoutMs",
        10000,
        "how long `write` waits for room in that window before failing",
        ge=0,
        le=DAY_MS,
    )
    batch_size: int = option(
        "batchSize",
        500,
        "most messages per publish frame; a frame also stays within the frame_max negotiated with the "
        "broker (`stream.frame_max`, 1 MiB by default), so large messages get smaller frames",
        ge=1,
        le=10_000,
    )
    compression: CompressionKind = option(
        "compression", "none", "`none`, `gzip`, `snappy`, `lz4`, `zstd`; needs `subEntrySize > 1`"
    )
    sub_entry_size: int = option(
        "subEntrySize",
        1,
        "messages per sub-entry batch; > 1 batches (and compresses) them, and deduplication is then not "
        "guaranteed (a warning is logged with `producerName`)",
        ge=1,
        le=65_535,  # a sub-entry's count is an unsigned 16-bit field
    )
    routing_strategy: RoutingStrategyKind = option(
        "routingStrategy",
        "hash",
        "super streams: `hash` (murmur3 of `routing_key`, as the Java/Go clients), `key` (the broker's "
        "bindings), `custom`",
        broker="3.11+",
    )
    partitioner_class: str | None = option(
        "partitionerClass",
        None,
        "with `routingStrategy=custom`: a class with `partition(routing_key, partitions) -> name(s)`",
        kind="class",
    )
    filter_value_path: str | None = option(
        "filterValuePath",
        None,
        "where each message's filter value comes from: `routing_key`, `application_properties.<key>`, "
        "`message_annotations.<key>` or `properties.<field>`",
        broker="3.13+",
    )
    ignore_unknown_columns: bool = option(
        "ignoreUnknownColumns", False, "drop columns the sink does not know instead of failing"
    )

    @field_validator("filter_value_path")
    @classmethod
    def _filter_value_path(cls, value: str | None) -> str | None:
        if value is None or value == "routing_key":
            return value
        head, dot, rest = value.partition(".")
        if dot and rest and head in ("application_properties", "message_annotations"):
            return value
        if dot and head == "properties" and rest in PROPERTY_NAMES:
            return value
        forms = (
            "routing_key, application_properties.<key>, message_annotations.<key> or "
            f"properties.<field> (field one of {', '.join(PROPERTY_NAMES)})"
        )
        raise err(f"option '{cls.alias('filter_value_path')}' must be {forms}; got {show(value)}")

    @model_validator(mode="after")
    def _rules(self) -> Self:
        n = self.alias
        check_target(self, self.stream, self.superstream)
        if self.compression != "none" and self.sub_entry_size <= 1:
            raise err(
                f"option '{n('compression')}'={self.compression} requires option '{n('sub_entry_size')}' > 1 "
                f"(compression applies to sub-entry batches); got {n('sub_entry_size')}={self.sub_entry_size}"
            )
        if self.routing_strategy == "custom" and self.partitioner_class is None:
            raise err(
                f"option '{n('routing_strategy')}'=custom requires option '{n('partitioner_class')}' "
                "(a dotted class path)"
            )
        if self.partitioner_class is not None and self.routing_strategy != "custom":
            raise err(
                f"option '{n('partitioner_class')}' is only used with {n('routing_strategy')}=custom; "
                f"{n('routing_strategy')} is '{self.routing_strategy}' "
                f"(valid values: {', '.join(ROUTING_STRATEGY_VALUES)})"
            )
        return self

    def writer_settings(self) -> dict[str, Any]:
        """Keyword arguments of the broker layer's `WriteSettings` these options give.

        The producer's identity is not among them (`producerName` becomes one name per task, with
        its publishing ids: spark/sink.py), nor what the encoder or the driver uses
        (`filterValuePath`, `ignoreUnknownColumns`).
        """
        return {
            "confirm_timeout_ms": self.publisher_confirm_timeout_ms,
            "max_in_flight": self.max_in_flight,
            "enqueue_timeout_ms": self.enqueue_timeout_ms,
            "batch_size": self.batch_size,
            "compression": self.compression,
            "sub_entry_size": self.sub_entry_size,
            "routing_strategy": self.routing_strategy,
            "partitioner_class": self.partitioner_class,
        }


def sink_from(values: dict[str, str]) -> SinkOptions:
    """Write options among normalized `values`: each read by its declaration, then the rules."""
    connection = connection_from(values)
    return build(SinkOptions, connection=connection, **Reader(values, SinkOptions).given())
