"""Batch and streaming writes: Arrow batches -> AMQP 1.0 messages -> producers with confirms.

Append only. The input schema is checked once on the driver (`check_sink_schema`); executors turn
each Arrow batch into messages, route them (super streams) and publish with a bounded confirm
window. `write()` returns only after every confirm arrived, so a task that succeeded has all its
rows in the broker; Spark's commit then only records what was written.

Deduplication (`producerName`) suppresses re-sent messages, and drops no new one as long as a
re-run yields the same rows in the same order (below). The broker
keeps, per (stream, producer name), the highest publishing id it stored and drops any message at or
below it; so each name must belong to one run of one job, and ids must be the same when that run
re-sends the same rows:
- batch: `<producerName>-<job token>-p<partition>`, ids 1, 2, ... in row order per partition
  stream. The token is drawn once per write job on the driver (the writer object is pickled to
  every task and attempt of the job), so a retried or speculative attempt re-publishes under the
  same name with the same ids and the broker drops what an earlier attempt stored, while another
  job (a later run, an Airflow retry) never shares a name with an earlier one;
- streaming: `<producerName>-<query id>-p<partition>`, ids `(epoch << 32) + 1 + row`, so a
  replayed epoch (a crash between the sink and the checkpoint commit) is dropped, and a new
  checkpoint (a new query id) never collides with an old one. Without a query id in the task's
  local properties, the epoch's writer token stands in: task retries are still deduplicated,
  replays are not (at-least-once, never a loss).
Row order must be the same on a re-run: ids are positions, not contents, so with non-deterministic
input (an unordered shuffle, `rand()`, a source that does not replay the same rows) the broker drops
the new rows at positions an earlier attempt stored and keeps re-sent rows at later positions twice
(docs/failure-semantics.md, "Writes with `producerName`"). Sub-entry batching numbers whole
batches, so it does not deduplicate single messages.

A re-sent row must also reach the partition stream it reached before: ids are positional per
partition stream. A batch job with `producerName` on a super stream asks for its partitions once,
on the driver (`job_partitions`), and every task and attempt routes over that list, so a partition
added while the job runs changes nothing for it (the next job routes over it), and one removed
fails the task with `RoutingChangedError`. A streaming query's tasks still route over the
partitions of the moment they start (its writer lives as long as the query, which must route over
a partition added meanwhile): a partition added between a failed attempt and its retry, or before
an epoch is replayed, moves re-sent rows, and the broker may drop some new rows as re-sent and keep
others twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.batches import MessageEncoder
from pyspark_rmqs.core.errors import ConfigurationError, DataError
from pyspark_rmqs.core.schema import PROPERTY_NAMES, SINK_COLUMNS
from pyspark_rmqs.options import SinkOptions

log = logging.getLogger(__name__)

_TS = (TimestampType, TimestampNTZType)


def check_sink_schema(schema: StructType, opts: SinkOptions) -> list[str]:
    """Validate the DataFrame's columns; return the ones to write. Errors name the column."""
    names = [f.name for f in schema.fields]
    unknown = [n for n in names if n not in SINK_COLUMNS]
    if unknown and not opts.ignore_unknown_columns:
        raise ConfigurationError(
            f"unknown column(s) {', '.join(repr(u) for u in unknown)} for a rabbitmq_streams write; valid "
            f"columns: {', '.join(SINK_COLUMNS)} (or set ignoreUnknownColumns=true to drop them)"
        )
    if "value" not in names:
        raise ConfigurationError("a rabbitmq_streams write needs a 'value' column (binary or string)")
    types = {f.name: f.dataType for f in schema.fields}

    def need(col: str, ok: bool, what: str) -> None:
        if col in types and not ok:
            raise ConfigurationError(f"column '{col}' must be {what}; it is {types[col].simpleString()}")

    need("value", isinstance(types["value"], BinaryType | StringType), "binary or string")
    need("stream", isinstance(types.get("stream"), StringType), "string")
    need("routing_key", isinstance(types.get("routing_key"), StringType), "string")
    need("creation_time", isinstance(types.get("creation_time"), _TS), "timestamp")
    for m in ("application_properties", "message_annotations"):
        t = types.get(m)
        need(m, isinstance(t, MapType) and isinstance(t.keyType, StringType), "a map with string keys")
    props = types.get("properties")
    if props is not None:
        if not isinstance(props, StructType):
            raise ConfigurationError(f"column 'properties' must be a struct; it is {props.simpleString()}")
        bad = [f.name for f in props.fields if f.name not in PROPERTY_NAMES]
        if bad:
            raise ConfigurationError(
                f"column 'properties' has unknown field(s) {', '.join(bad)}; "
                f"valid fields: {', '.join(PROPERTY_NAMES)}"
            )
        _check_property_types(props)
    if opts.filter_value_path and opts.sub_entry_size > 1:
        raise ConfigurationError(
            "option 'filterValuePath' cannot be combined with subEntrySize > 1: a sub-entry batch carries no "
            "per-message filter values; use subEntrySize=1 for filtered streams"
        )
    if opts.is_super_stream and "routing_key" not in names:
        raise ConfigurationError(
            f"writing to super stream '{opts.superstream}' needs a 'routing_key' column (string)"
        )
    return [n for n in names if n in SINK_COLUMNS]


def _check_property_types(props: StructType) -> None:
    for f in props.fields:
        t: DataType = f.dataType
        if f.name in ("absolute_expiry_time", "creation_time"):
            ok = isinstance(t, _TS)
        elif f.name == "user_id":
            ok = isinstance(t, BinaryType | StringType)
        elif f.name == "group_sequence":
            ok = t.typeName() in ("long", "integer", "short", "byte")
        else:
            ok = isinstance(t, StringType)
        if not ok:
            raise ConfigurationError(f"column 'properties.{f.name}' has unsupported type {t.simpleString()}")


@dataclass
class WriteResult(WriterCommitMessage):
    """What one task wrote: messages per partition stream and the producer name used."""

    partition_id: int
    attempt: int
    messages: dict[str, int] = field(default_factory=dict)
    producer_name: str | None = None


# The stream protocol's limit on producer references, and the most the sink appends to producerName.
_REFERENCE_MAX_BYTES = 256
_NAME_SUFFIX_MAX_BYTES = len("-") + 16 + len("-p") + 10
_EPOCH_BITS = 32
_warned_sub_entry = False


@dataclass(frozen=True)
class TaskIdentity:
    """Where a write task runs: its partition and attempt, and for streaming its epoch and query."""

    partition: int = 0
    attempt: int = 0
    epoch: int | None = None
    query_id: str | None = None


@dataclass(frozen=True)
class Dedup:
    """The producer name and publishing ids one task uses (no name: no deduplication)."""

    name: str | None = None
    first_id: int = 1
    id_limit: int | None = None


def new_job_token() -> str:
    """A token unique to one write job (64 random bits: no two jobs' producer names collide)."""
    return uuid.uuid4().hex[:16]


def _task_identity() -> TaskIdentity:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return TaskIdentity()
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    return TaskIdentity(
        ctx.partitionId(),
        ctx.attemptNumber(),
        int(batch) if batch is not None else None,
        ctx.getLocalProperty("sql.streaming.queryId"),
    )


def dedup_for(producer_name: str | None, job_token: str, task: TaskIdentity) -> Dedup:
    """The name and ids of one task: stable across its attempts and replays, unique to its job/query.

    The attempt number is never part of the name: a retried attempt must re-publish under the same
    name with the same ids, or the broker cannot drop what the failed attempt stored.
    """
    if not producer_name:
        return Dedup()
    if task.epoch is None:
        return Dedup(f"{producer_name}-{job_token}-p{task.partition}")
    scope = task.query_id.replace("-", "")[:16] if task.query_id else job_token
    base = task.epoch << _EPOCH_BITS
    return Dedup(f"{producer_name}-{scope}-p{task.partition}", base + 1, base + (1 << _EPOCH_BITS))


def check_producer_name(opts: SinkOptions) -> None:
    """Driver side: the derived names must fit a stream-protocol reference; warn where dedup cannot work."""
    if not opts.producer_name:
        return
    size = len(opts.producer_name.encode("utf-8"))
    if size + _NAME_SUFFIX_MAX_BYTES > _REFERENCE_MAX_BYTES:
        raise ConfigurationError(
            f"option 'producerName' is {size} bytes; the sink appends up to {_NAME_SUFFIX_MAX_BYTES} bytes "
            f"(-<job or query token>-p<partition>) and a producer name may have at most "
            f"{_REFERENCE_MAX_BYTES}: use at most {_REFERENCE_MAX_BYTES - _NAME_SUFFIX_MAX_BYTES} bytes"
        )
    global _warned_sub_entry
    if opts.sub_entry_size > 1 and not _warned_sub_entry:
        _warned_sub_entry = True  # Spark builds a streaming writer per epoch: say it once
        log.warning(
            "producerName=%s with subEntrySize=%d: a sub-entry batch carries one publishing id for all its "
            "messages, so deduplication of re-sent messages is not guaranteed (use subEntrySize=1 for it)",
            opts.producer_name,
            opts.sub_entry_size,
        )


def write_settings(opts: SinkOptions, dedup: Dedup) -> WriteSettings:
    """A task's producer settings: the options' (`SinkOptions.writer_settings`) and its identity (`dedup`)."""
    return WriteSettings(
        **opts.writer_settings(),
        producer_name=dedup.name,
        resume_sequence=False,
        first_publishing_id=dedup.first_id,
        publishing_id_limit=dedup.id_limit,
    )


def job_partitions(opts: SinkOptions) -> list[str] | None:
    """Driver side, once per batch write job with `producerName` on a super stream: the partition
    streams every task and attempt of the job routes over (see the module docstring). None: each
    task asks for them when it starts."""
    if not (opts.producer_name and opts.is_super_stream and opts.superstream):
        return None
    return BrokerClient(opts.connection).partitions(opts.superstream)


def write_task(
    opts: SinkOptions,
    columns: list[str],
    job_token: str,
    batches: Iterator[pa.RecordBatch],
    partitions: list[str] | None = None,
) -> WriteResult:
    """Executor side: publish every row of this task and wait for every confirm; on a super stream
    routed over `partitions` (the job's, `job_partitions`) when given, else over today's."""
    task = _task_identity()
    dedup = dedup_for(opts.producer_name, job_token, task)
    encoder = MessageEncoder(
        columns,
        filter_value_path=opts.filter_value_path,
        stream=None if opts.is_super_stream else opts.stream,
    )
    producer = StreamProducer(
        opts.connection,
        opts.name,
        superstream=opts.is_super_stream,
        settings=write_settings(opts, dedup),
        partitions=partitions,
    )
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            msgs, keys, filters = encoder.encode(batch)
            if opts.is_super_stream and keys is not None:
                for i, k in enumerate(keys):
                    if k is None:
                        raise DataError(
                            f"row {encoder.rows_seen - len(keys) + i} of this task has a null 'routing_key'; "
                            f"writing to super stream '{opts.superstream}' routes every row by its key"
                        )
            producer.send(msgs, keys if opts.is_super_stream else None, filters)
        producer.flush()
        counts = producer.message_counts()
    finally:
        producer.close()
    return WriteResult(task.partition, task.attempt, counts, dedup.name)


class RabbitMQStreamsWriter(DataSourceArrowWriter):
    """`df.write.format("rabbitmq_streams")`: built once per write job on the driver."""

    def __init__(self, opts: SinkOptions, columns: list[str]) -> None:
        check_producer_name(opts)
        self.opts = opts
        self.columns = columns
        self.job_token = new_job_token()  # pickled with the writer: one per job, shared by every attempt
        self.partitions = job_partitions(opts)  # the same: every attempt routes over them

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return write_task(self.opts, self.columns, self.job_token, iterator, self.partitions)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(sum(m.messages.values()) for m in messages if isinstance(m, WriteResult))
        log.info("rabbitmq_streams write to '%s' committed: %d message(s)", self.opts.name, total)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(sum(m.messages.values()) for m in messages if isinstance(m, WriteResult))
        log.warning(
            "rabbitmq_streams write to '%s' aborted; %d message(s) from finished tasks are in the stream "
            "(a stream cannot take messages back)",
            self.opts.name,
            done,
        )


class RabbitMQStreamsStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("rabbitmq_streams")`: commit is idempotent per epoch (batch id).

    Spark builds one per epoch; producer names come from the query id (see the module docstring),
    the token only stands in when a task has no query id.
    """

    def __init__(self, opts: SinkOptions, columns: list[str]) -> None:
        check_producer_name(opts)
        self.opts = opts
        self.columns = columns
        self.job_token = new_job_token()
        self._committed: set[int] = set()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return write_task(self.opts, self.columns, self.job_token, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if batchId in self._committed:
            return
        self._committed.add(batchId)
        total = sum(sum(m.messages.values()) for m in messages if isinstance(m, WriteResult))
        log.info("rabbitmq_streams epoch %d to '%s' committed: %d message(s)", batchId, self.opts.name, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("rabbitmq_streams epoch %d to '%s' aborted", batchId, self.opts.name)
