"""Resolving what to read: partition streams, start and end offsets, data loss, version gates.

Runs on the driver (Spark's planner, Airflow, Dagster); talks to the broker through `BrokerClient`,
never reads messages. Every data-loss decision goes through `report_data_loss`. Read positions
(earliest, latest, offsets, offsets JSON, timestamps, the watermark) have one resolver,
`resolve_positions`, used by the Spark batch and streaming readers and the orchestration jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from pyspark_rmqs.broker.client import BrokerClient, parse_version
from pyspark_rmqs.codec import to_millis
from pyspark_rmqs.errors import (
    ConfigurationError,
    UnsupportedBrokerError,
    lost_message,
    report_data_loss,
)
from pyspark_rmqs.offsets import EARLIEST, LATEST, offsets_from_json
from pyspark_rmqs.options import SourceOptions

log = logging.getLogger(__name__)

SUPER_STREAMS = (3, 11, 0)
FILTERING = (3, 13, 0)


def check_version(
    client: BrokerClient, opts: SourceOptions | None = None, *, superstream: bool = False
) -> str:
    """Fail with a clear message when an option needs a newer broker than the one connected."""
    version = client.broker_version()
    v = parse_version(version)
    if (superstream or (opts is not None and opts.is_super_stream)) and v < SUPER_STREAMS:
        raise UnsupportedBrokerError(f"super streams need RabbitMQ 3.11 or newer; the broker is {version}")
    if opts is not None and opts.filter_values and v < FILTERING:
        raise UnsupportedBrokerError(
            f"option 'filterValues' needs RabbitMQ 3.13 or newer (stream filtering); the broker is {version}"
        )
    return version


def partition_streams(client: BrokerClient, opts: SourceOptions) -> list[str]:
    """The streams read: the stream itself, or the super stream's partitions in the broker's order."""
    parts = opts.target.streams(client, hint=f" (option '{opts.alias('stream')}')")
    if opts.is_super_stream:
        opts.validate_partitions(parts)
    return parts


@dataclass(frozen=True)
class Bounds:
    """Per partition stream: first available offset and tail (offset after the last message)."""

    first: dict[str, int]
    tail: dict[str, int]


def bounds(client: BrokerClient, streams: Iterable[str], fail_on_data_loss: bool = True) -> Bounds:
    """First offsets and tails; a partition that vanished is data loss (skipped when allowed)."""
    first: dict[str, int] = {}
    tail: dict[str, int] = {}
    for s, found in client.bounds(streams).items():
        if found is None:
            report_data_loss(fail_on_data_loss, f"partition stream '{s}' no longer exists")
        else:
            first[s], tail[s] = found
    return Bounds(first, tail)


# A read position: "earliest", "latest", "watermark" (starts only), offsets JSON, per-stream offsets
# (values may be the EARLIEST / LATEST sentinels), or a timestamp (datetime, or epoch milliseconds).
Position = str | int | datetime | Mapping[str, int]


def resolve_positions(
    client: BrokerClient | None,
    b: Bounds,
    pos: Position,
    *,
    is_end: bool,
    stored: Mapping[str, int | None] | None = None,
    fallback: str = "earliest",
) -> dict[str, int]:
    """The offset per partition stream of `b` for a start (`is_end=False`) or an end position.

    A stream an offsets map does not name reads from its first offset (a start) or to its tail (an
    end). `"watermark"` is the stored offset + 1 from `stored`, or `fallback` (earliest or latest)
    where nothing is stored. Retention clamping and data-loss reports are the caller's next step.
    """
    if isinstance(pos, str) and pos.strip().startswith("{"):
        pos = offsets_from_json(pos, "end" if is_end else "start")
    out: dict[str, int] = {}
    for s, tail in b.tail.items():
        first = b.first[s]
        if isinstance(pos, Mapping):
            v = pos.get(s)
            if v is None:
                out[s] = tail if is_end else first
            else:
                out[s] = tail if v == LATEST else first if v == EARLIEST else int(v)
        elif isinstance(pos, datetime) or (isinstance(pos, int) and not isinstance(pos, bool)):
            if client is None:
                raise ConfigurationError(f"{'an end' if is_end else 'a start'} cannot be a timestamp here")
            out[s] = client.offset_for_timestamp(s, to_millis(pos))
        elif pos == "latest":
            out[s] = tail
        elif pos == "earliest":
            out[s] = first
        elif pos == "watermark" and not is_end:
            if stored is None:
                raise ConfigurationError(
                    "start='watermark' needs a consumer_name (whose stored offset is the watermark)"
                )
            v = stored.get(s)
            out[s] = v + 1 if v is not None else (tail if fallback == "latest" else first)
        else:
            valid = (
                "'latest', offsets JSON/dict or a timestamp"
                if is_end
                else "'watermark', 'earliest', 'latest', offsets JSON/dict or a timestamp"
            )
            raise ConfigurationError(f"{'end' if is_end else 'start'} must be {valid}; got {pos!r}")
    return out


def source_position(opts: SourceOptions, streams: Iterable[str], *, is_end: bool) -> Position:
    """The Spark source options `startingOffsets`... / `endingOffsets`... as a position."""
    kind = (opts.ending_offsets or "latest") if is_end else opts.starting_offsets
    if kind == "offset":
        value = opts.ending_offset if is_end else opts.starting_offset
        assert value is not None
        return dict.fromkeys(streams, value)
    if kind == "timestamp" and not is_end:
        assert opts.starting_timestamp is not None
        return int(opts.starting_timestamp)
    if kind in ("earliest", "latest"):
        return kind
    return dict((opts.ending_offsets_json if is_end else opts.starting_offsets_json) or {})


def starting_offsets(client: BrokerClient, opts: SourceOptions, b: Bounds) -> dict[str, int]:
    """Next offsets to read from, per stream, from `startingOffsets` (before data-loss checks)."""
    return resolve_positions(client, b, source_position(opts, b.tail, is_end=False), is_end=False)


def ending_offsets(opts: SourceOptions, b: Bounds) -> dict[str, int]:
    """End offsets (exclusive) for a batch read, fixed now: never beyond the tail (batch never waits)."""
    out = resolve_positions(None, b, source_position(opts, b.tail, is_end=True), is_end=True)
    for s, end in out.items():
        if end > b.tail[s]:
            log.info(
                "endingOffsets for '%s' is %d, beyond the tail %d: reading to the tail", s, end, b.tail[s]
            )
            out[s] = b.tail[s]
    return out


def clamp_to_retention(starts: Mapping[str, int], b: Bounds, fail_on_data_loss: bool) -> dict[str, int]:
    """Starts below the retention floor are data loss: fail, or advance to the first offset."""
    out = dict(starts)
    for s, start in starts.items():
        first = b.first.get(s)
        if first is not None and start < first:
            report_data_loss(fail_on_data_loss, lost_message(s, start, first, "retention removed them"))
            out[s] = first
    return out


def stored_starts(client: BrokerClient, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
    """Next offsets from the broker-stored offsets of `consumer` (stored + 1), None where none."""
    stored = client.stored_offsets(consumer, list(streams))
    return {s: (v + 1 if v is not None else None) for s, v in stored.items()}
