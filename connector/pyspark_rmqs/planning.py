"""Resolving what to read: partition streams, start and end offsets, data loss, version gates.

Runs on the driver (Spark's planner, Airflow, Dagster); talks to the broker through `BrokerClient`,
never reads messages. Every data-loss decision goes through `report_data_loss`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark_rmqs.broker.client import BrokerClient, parse_version
from pyspark_rmqs.errors import StreamNotFoundError, UnsupportedBrokerError, lost_message, report_data_loss
from pyspark_rmqs.offsets import EARLIEST, LATEST
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
    if opts.superstream is not None:
        parts = client.partitions(opts.superstream)
        opts.validate_partitions(parts)
        return parts
    assert opts.stream is not None
    if not client.stream_exists(opts.stream):
        raise StreamNotFoundError(f"stream '{opts.stream}' does not exist (option 'stream')")
    return [opts.stream]


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


def starting_offsets(client: BrokerClient, opts: SourceOptions, b: Bounds) -> dict[str, int]:
    """Next offsets to read from, per stream, from `startingOffsets` (before data-loss checks)."""
    out: dict[str, int] = {}
    for s in b.tail:
        kind = opts.starting_offsets
        if kind == "earliest":
            out[s] = b.first[s]
        elif kind == "latest":
            out[s] = b.tail[s]
        elif kind == "offset":
            assert opts.starting_offset is not None
            out[s] = opts.starting_offset
        elif kind == "timestamp":
            assert opts.starting_timestamp is not None
            out[s] = client.offset_for_timestamp(s, opts.starting_timestamp)
        else:
            v = (opts.starting_offsets_json or {}).get(s, EARLIEST)
            out[s] = b.first[s] if v == EARLIEST else b.tail[s] if v == LATEST else v
    return out


def ending_offsets(opts: SourceOptions, b: Bounds) -> dict[str, int]:
    """End offsets (exclusive) for a batch read, fixed now: never beyond the tail (batch never waits)."""
    out: dict[str, int] = {}
    for s, tail in b.tail.items():
        kind = opts.ending_offsets or "latest"
        if kind == "latest":
            end = tail
        elif kind == "offset":
            assert opts.ending_offset is not None
            end = opts.ending_offset
        else:
            v = (opts.ending_offsets_json or {}).get(s, LATEST)
            end = tail if v == LATEST else v
        if end > tail:
            log.info("endingOffsets for '%s' is %d, beyond the tail %d: reading to the tail", s, end, tail)
            end = tail
        out[s] = end
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
