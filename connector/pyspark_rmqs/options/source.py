"""The read options' table (`SourceOptions`), their cross-option rules, and how they are parsed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, get_args

from pydantic import model_validator

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.core.offsets import offsets_from_json
from pyspark_rmqs.core.schema import METADATA_FIELDS
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.options.connection import ConnectionOptions, connection_from
from pyspark_rmqs.options.fields import (
    DAY_MS,
    INT_MAX,
    LONG_MAX,
    OptionModel,
    Reader,
    build,
    err,
    option,
    show,
    split_list,
)

StartingOffsetsKind = Literal["earliest", "latest", "offset", "timestamp", "json"]
EndingOffsetsKind = Literal["latest", "offset", "json"]
STARTING_OFFSETS_VALUES = tuple(v for v in get_args(StartingOffsetsKind) if v != "json")
ENDING_OFFSETS_VALUES = tuple(v for v in get_args(EndingOffsetsKind) if v != "json")


def check_target(model: OptionModel, stream: str | None, superstream: str | None) -> Target:
    """Exactly one of `stream` / `superstream` (reads and writes alike), in the options' words."""
    try:
        return Target.of(stream, superstream)
    except ConfigurationError:
        state = "both are set" if stream is not None else "neither is set"
        raise err(
            f"exactly one of the options '{model.alias('stream')}' or '{model.alias('superstream')}' "
            f"must be set; {state}"
        ) from None


class TargetOptions(OptionModel):
    """What the read and the write tables share about their `stream` / `superstream` pair."""

    if TYPE_CHECKING:  # declared by each table (its own doc line); checked by `check_target`
        stream: str | None
        superstream: str | None

    @property
    def target(self) -> Target:
        """The stream or super stream, as the one value the layers below take."""
        return Target.of(self.stream, self.superstream)

    @property
    def is_super_stream(self) -> bool:
        return self.superstream is not None

    @property
    def name(self) -> str:
        """The stream or super stream read or written."""
        return self.target.name


class SourceOptions(TargetOptions):
    """Options of a batch (`spark.read`) or streaming (`spark.readStream`) read.

    `starting_offsets` / `ending_offsets` is "json" when a JSON object was given; the object is then
    in `starting_offsets_json` / `ending_offsets_json` (partition stream -> next offset, with
    -1 = latest and, when starting, -2 = earliest). `ending_offsets` is None for streaming reads.
    """

    DERIVED_FROM: ClassVar[Mapping[str, str]] = {
        "starting_offsets_json": "startingOffsets",
        "ending_offsets_json": "endingOffsets",
    }

    connection: ConnectionOptions
    streaming: bool = False
    stream: str | None = option(
        "stream", None, "the stream to read; exactly one of `stream` / `superstream`", broker="3.9+"
    )
    superstream: str | None = option(
        "superstream", None, "the super stream whose partitions are read", broker="3.11+"
    )
    consumer_name: str | None = option(
        "consumerName",
        None,
        "name whose broker-stored offsets resume a query without a checkpoint, and which streaming "
        "commits store; at most 256 bytes",
        kind="reference",
    )
    metadata_fields: tuple[str, ...] = option(
        "metadataFields",
        METADATA_FIELDS,
        "comma-separated subset of `properties`, `application_properties`, `message_annotations`, "
        "`creation_time`, `routing_key`; empty = fixed columns only",
        kind="parsed",
        shown="all five",
    )
    fail_on_data_loss: bool = option(
        "failOnDataLoss",
        True,
        "fail when offsets to read were removed by retention or a partition vanished; `false` logs and "
        "skips them. A start by timestamp on a stream retention truncated is data loss when the oldest "
        "chunk kept is later than that time (what was removed may hold messages at or after it)",
    )
    starting_offsets: StartingOffsetsKind = option(
        "startingOffsets",
        "earliest",
        '`earliest`, `latest`, `offset`, `timestamp`, or a JSON object `{"orders-0": 42, ...}` (`-2` '
        "earliest, `-1` latest); JSON keys must be partition streams of the target, and a partition the "
        "JSON does not name starts at its first offset",
        kind="parsed",
    )
    starting_offset: int | None = option(
        "startingOffset", None, "with `startingOffsets=offset`: the first offset", ge=0, le=LONG_MAX
    )
    starting_timestamp: int | None = option(
        "startingTimestamp",
        None,
        "with `startingOffsets=timestamp`: epoch milliseconds",
        ge=0,
        le=LONG_MAX,
    )
    starting_offsets_json: dict[str, int] | None = None
    ending_offsets: EndingOffsetsKind | None = option(
        "endingOffsets",
        "latest",
        "batch only: `latest`, `offset`, or a JSON object (`-1` latest) that names the partitions read: "
        "a partition it does not name is not read; a streaming read with it fails",
        kind="parsed",
    )
    ending_offset: int | None = option(
        "endingOffset",
        None,
        "with `endingOffsets=offset`: the end (exclusive), not before `startingOffset`",
        ge=0,
        le=LONG_MAX,
    )
    ending_offsets_json: dict[str, int] | None = None
    max_records_per_trigger: int | None = option(
        "maxRecordsPerTrigger",
        None,
        "streaming: at most this many messages per micro-batch",
        ge=1,
        le=INT_MAX,
    )
    max_bytes_per_trigger: int | None = option(
        "maxBytesPerTrigger",
        None,
        "streaming: about this many bytes per micro-batch, from a running average message size",
        ge=1,
        le=1 << 40,  # a terabyte is past any executor
    )
    min_partitions: int | None = option(
        "minPartitions",
        None,
        "split the ranges into at least this many Spark tasks",
        ge=1,
        le=100_000,  # every partition is a Spark task planned on the driver
    )
    server_side_offset_tracking: bool = option(
        "serverSideOffsetTracking",
        False,
        "store the last committed offset per partition for `consumerName` when a micro-batch commits. "
        "A Python data source never sees the query id, so there is no derived consumer name: without "
        "`consumerName` nothing is stored, and `serverSideOffsetTracking=true` without `consumerName` "
        "fails (set `consumerName`, or drop the option)",
        shown="`true` for a streaming read with `consumerName`; `false` without one, and for batch reads",
    )
    filter_values: list[str] | None = option(
        "filterValues",
        None,
        "comma-separated filter values: the broker sends only chunks that may hold them",
        kind="parsed",
        broker="3.13+",
    )
    filter_match_unfiltered: bool = option(
        "filterMatchUnfiltered",
        False,
        "with `filterValues`: also receive messages published without a filter value",
        broker="3.13+",
    )
    filter_post_filter_class: str | None = option(
        "filterPostFilterClass",
        None,
        "dotted path of a class with `matches(message) -> bool`, applied to each message of a delivered "
        "chunk (Bloom filters allow false positives)",
        kind="class",
        broker="3.13+",
    )
    # waits: a day without a chunk (a week for a whole read) is a stuck read, not a slow one
    poll_timeout_ms: int = option(
        "pollTimeoutMs",
        30000,
        "fail a read when no chunk arrives for this long while offsets are still missing",
        ge=1,
        le=DAY_MS,
    )
    max_wait_ms: int = option(
        "maxWaitMs", 300000, "fail a read that takes longer than this in total", ge=1, le=7 * DAY_MS
    )
    # memory per reader: chunks granted, messages queued
    initial_credits: int = option(
        "initialCredits",
        0,
        "chunks the broker may send before the reader asks for more; 0: adaptive, as many as "
        "`queueCapacity` holds at the chunk sizes seen (at most 32 chunks, 32 MiB)",
        ge=0,
        le=1000,
    )
    queue_capacity: int = option(
        "queueCapacity", 10000, "messages buffered per reader before credits pause", ge=1, le=10_000_000
    )
    estimated_message_size_bytes: int = option(
        "estimatedMessageSizeBytes",
        1024,
        "message size assumed by `maxBytesPerTrigger` before any is measured",
        ge=1,
        le=1 << 30,
    )
    strict_decoding: bool = option(
        "strictDecoding",
        False,
        "`true`: a message that is not valid AMQP 1.0 fails the read naming stream and offset; "
        "`false`: its raw bytes become `value`. A corrupt chunk (cut short, failing its CRC, a "
        "compressed batch not of its declared size) fails the read either way",
    )

    @model_validator(mode="after")
    def _rules(self) -> Self:
        n = self.alias
        check_target(self, self.stream, self.superstream)
        kind = self.starting_offsets
        if kind == "offset" and self.starting_offset is None:
            raise err(
                f"option '{n('starting_offset')}' (an integer >= 0) is required when "
                f"{n('starting_offsets')}=offset"
            )
        if kind == "timestamp" and self.starting_timestamp is None:
            raise err(
                f"option '{n('starting_timestamp')}' (epoch milliseconds, an integer >= 0) is required "
                f"when {n('starting_offsets')}=timestamp"
            )
        if self.starting_offset is not None and kind != "offset":
            raise err(
                f"option '{n('starting_offset')}' is only used with {n('starting_offsets')}=offset, "
                f"not '{kind}'"
            )
        if self.starting_timestamp is not None and kind != "timestamp":
            raise err(
                f"option '{n('starting_timestamp')}' is only used with {n('starting_offsets')}=timestamp, "
                f"not '{kind}'"
            )
        self._check_single_stream_json("starting_offsets", self.starting_offsets_json)
        if self.ending_offsets == "offset" and self.ending_offset is None:
            raise err(
                f"option '{n('ending_offset')}' (an integer >= 0) is required when "
                f"{n('ending_offsets')}=offset"
            )
        if self.ending_offset is not None and self.ending_offsets != "offset":
            raise err(
                f"option '{n('ending_offset')}' is only used with {n('ending_offsets')}=offset, "
                f"not '{self.ending_offsets}'"
            )
        self._check_single_stream_json("ending_offsets", self.ending_offsets_json)
        self._check_range()
        if self.server_side_offset_tracking and self.consumer_name is None:
            raise err(
                f"option '{n('server_side_offset_tracking')}'=true stores offsets under option "
                f"'{n('consumer_name')}', which is not set: set {n('consumer_name')} to a stable name "
                f"(or drop {n('server_side_offset_tracking')})"
            )
        return self

    def _check_single_stream_json(self, field: str, offsets: dict[str, int] | None) -> None:
        if offsets is None or self.stream is None:
            return
        unknown = sorted(set(offsets) - {self.stream})
        if unknown:
            raise err(
                f"option '{self.alias(field)}' names stream(s) {', '.join(repr(u) for u in unknown)}, but "
                f"this read is of stream '{self.stream}'; the only valid name is '{self.stream}'"
            )

    def _check_range(self) -> None:
        n = self.alias
        start, end = self.starting_offset, self.ending_offset
        if start is not None and end is not None and end < start:
            raise err(
                f"option '{n('ending_offset')}' ({end}) must be >= option '{n('starting_offset')}' ({start})"
            )
        start_json, end_json = self.starting_offsets_json or {}, self.ending_offsets_json or {}
        for stream, end_offset in end_json.items():
            start_offset = start_json.get(stream)
            if start_offset is not None and start_offset >= 0 and 0 <= end_offset < start_offset:
                raise err(
                    f"option '{n('ending_offsets')}' ({end_offset}) is before option "
                    f"'{n('starting_offsets')}' ({start_offset}) for stream {stream!r}"
                )

    def reader_settings(self) -> dict[str, Any]:
        """Keyword arguments of the broker layer's `ReadSettings` these options give.

        The post filter is not among them: its class is loaded where the read runs.
        """
        return {
            "metadata_fields": self.metadata_fields,
            "initial_credits": self.initial_credits,
            "queue_capacity": self.queue_capacity,
            "poll_timeout_ms": self.poll_timeout_ms,
            "max_wait_ms": self.max_wait_ms,
            "filter_values": tuple(self.filter_values or ()),
            "filter_match_unfiltered": self.filter_match_unfiltered,
            "strict": self.strict_decoding,
            "fail_on_data_loss": self.fail_on_data_loss,
        }

    def validate_partitions(self, partitions: list[str]) -> None:
        """Fail when an offsets JSON object names a stream that is not one of `partitions`."""
        valid = set(partitions)
        what = self.target.describe()
        for field, offsets in (
            ("starting_offsets", self.starting_offsets_json),
            ("ending_offsets", self.ending_offsets_json),
        ):
            unknown = sorted(set(offsets or {}) - valid)
            if unknown:
                raise err(
                    f"option '{self.alias(field)}' names stream(s) {', '.join(repr(u) for u in unknown)} "
                    f"that are not partitions of {what}; valid names: {', '.join(sorted(valid)) or '(none)'}"
                )


def _offsets_kind(r: Reader, field: str, values: tuple[str, ...], *, starting: bool) -> dict[str, Any]:
    """`startingOffsets` / `endingOffsets`: one of `values`, or "json" with the parsed object."""
    raw = r.text(field)
    if raw is None:
        return {}
    name = r.name(field)
    if raw.startswith("{"):
        offsets = offsets_from_json(raw, name, earliest=starting, empty=False)
        return {field: "json", f"{field}_json": offsets}
    if raw.lower() in values:
        return {field: raw.lower()}
    raise err(
        f"option '{name}' must be one of {', '.join(values)} or a JSON "
        f'object like {{"orders-0": 1200}}; got {show(raw)}'
    )


def _metadata_fields(r: Reader) -> dict[str, Any]:
    value = r.text("metadata_fields", allow_empty=True)
    if value is None:
        return {}
    wanted = {item.lower() for item in split_list(value)}
    unknown = sorted(wanted - set(METADATA_FIELDS))
    if unknown:
        raise err(
            f"option '{r.name('metadata_fields')}' has unknown field(s) "
            f"{', '.join(repr(u) for u in unknown)}; "
            f"valid fields are: {', '.join(METADATA_FIELDS)} (comma-separated; empty for none)"
        )
    return {"metadata_fields": tuple(field for field in METADATA_FIELDS if field in wanted)}


def _filter_values(r: Reader) -> dict[str, Any]:
    text = r.text("filter_values", allow_empty=True)
    if text is None:
        return {}
    values = split_list(text)
    if not values:
        raise err(f"option '{r.name('filter_values')}' must list at least one value (comma-separated)")
    return {"filter_values": values}


def source_from(values: dict[str, str], *, streaming: bool) -> SourceOptions:
    """Read options among normalized `values`: each read by its declaration, then the rules."""
    r = Reader(values, SourceOptions)
    connection = connection_from(values)
    if streaming:
        for field in ("ending_offsets", "ending_offset"):
            if r.has(field):
                raise err(
                    f"option '{r.name(field)}' is batch-only: it cannot be used with a streaming read "
                    f"(spark.readStream); use spark.read for a bounded read"
                )
    fields = r.given()
    fields.update(_offsets_kind(r, "starting_offsets", STARTING_OFFSETS_VALUES, starting=True))
    if streaming:
        fields["ending_offsets"] = None
    else:
        fields.update(_offsets_kind(r, "ending_offsets", ENDING_OFFSETS_VALUES, starting=False))
    fields.update(_metadata_fields(r))
    fields.update(_filter_values(r))
    # No query id reaches a Python data source: tracking is on by default only with a consumer name.
    fields.setdefault("server_side_offset_tracking", streaming and fields.get("consumer_name") is not None)
    return build(SourceOptions, connection=connection, streaming=streaming, **fields)
