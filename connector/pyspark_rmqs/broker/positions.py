"""Resolving what to read: partition streams, start and end offsets, data loss, version gates.

Runs on the driver (Spark's planner, Airflow, Dagster); talks to the broker through `BrokerClient`,
never reads messages. Every data-loss decision goes through `report_data_loss`. Read positions
(earliest, latest, offsets, offsets JSON, timestamps, the watermark) have one resolver,
`resolve_positions`, used by the Spark batch and streaming readers and the orchestration jobs; a
start by timestamp on a stream retention truncated is checked by one function,
`timestamp_start_loss`, used by the same three. Whether the broker's clock passed a time (a time
window's or a time range's end: `broker_time_bounds`, `check_time_end`) is decided here too, for
Dagster's time windows and Airflow's time ranges alike.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark_rmqs.broker.client import BrokerClient, TimeBound, parse_version
from pyspark_rmqs.core.codec import to_millis
from pyspark_rmqs.core.errors import (
    ConfigurationError,
    OpenWindowError,
    UnsupportedBrokerError,
    lost_message,
    report_data_loss,
)
from pyspark_rmqs.core.offsets import EARLIEST, LATEST, offsets_from_json
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
    """The streams read: the stream itself, or the super stream's partitions in the broker's order.

    An `endingOffsets` JSON object (batch reads) names the partitions a read covers: a partition it
    does not name is not read. Its end is what bounds a batch read, and a plan recorded as offsets
    JSON (`jobs.read_options`, a saved range) must read the same partitions after the super stream
    gained one. Spark's Kafka source refuses such a JSON outright; naming a partition with -1 reads it
    to its tail. A `startingOffsets` JSON does not restrict: an unnamed partition starts at its first
    offset, as partitions added to a streaming query do.
    """
    parts = opts.target.streams(client, hint=f" (option '{opts.alias('stream')}')")
    if opts.is_super_stream:
        opts.validate_partitions(parts)
        if opts.ending_offsets_json is not None:
            unnamed = [p for p in parts if p not in opts.ending_offsets_json]
            if unnamed:
                log.info(
                    "option '%s' does not name partition stream(s) %s of '%s': not read",
                    opts.alias("ending_offsets"),
                    ", ".join(unnamed),
                    opts.name,
                )
            parts = [p for p in parts if p in opts.ending_offsets_json]
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


def is_timestamp(pos: Position) -> bool:
    """Whether a position is a time (a datetime, or epoch milliseconds) rather than offsets or a name."""
    return isinstance(pos, datetime) or (isinstance(pos, int) and not isinstance(pos, bool))


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

    A stream of `b` an offsets map does not name reads from its first offset (a start) or to its tail
    (an end); which streams a Spark batch read plans at all is `partition_streams`' to say.
    `"watermark"` is the stored offset + 1 from `stored`, or `fallback` (earliest or latest) where
    nothing is stored. Retention clamping and data-loss reports (`clamp_to_retention`,
    `timestamp_start_loss`) are the caller's next step.
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
        elif is_timestamp(pos):
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
    """Next offsets to read from, per stream of `b`, from `startingOffsets`.

    A timestamp start is checked for data loss here (`timestamp_start_loss`); a start below the
    first offset is the caller's to clamp (`clamp_to_retention`).
    """
    pos = source_position(opts, b.tail, is_end=False)
    out = resolve_positions(client, b, pos, is_end=False)
    timestamp_start_loss(client, b, pos, opts.fail_on_data_loss)
    return out


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


def timestamp_start_loss(
    client: BrokerClient, b: Bounds, pos: Position, fail_on_data_loss: bool
) -> dict[str, list[int]]:
    """Data loss of a start by timestamp: retention may have removed messages at or after it.

    A timestamp resolves to the first chunk at or after it, and retention leaves no trace of what it
    removed: on a stream whose first offset is above 0, a read from a time before the oldest chunk
    kept starts at that chunk, and the removed offsets `[0, first)` may hold messages at or after
    the requested time. That is data loss, decided by the broker's clock: reported (`failOnDataLoss`)
    when the oldest chunk kept is later than the requested time; when it is at or before it, every
    removed message was older and nothing is reported. Positions that are not times report nothing.

    Returns the spans reported per stream (`[0, first]`), for a run summary when they were skipped.
    """
    if not is_timestamp(pos):
        return {}
    at = to_millis(pos)
    truncated = [s for s, first in b.first.items() if first > 0]
    if not truncated:
        return {}
    lost: dict[str, list[int]] = {}
    for s, oldest in client.oldest_chunks(truncated).items():
        if oldest is None or oldest[1] <= at:
            continue
        offset, ts = oldest
        removed = max(b.first[s], offset)  # retention may have moved on since the bounds were read
        why = (
            f"retention removed them, and the oldest chunk kept (offset {offset}) is from {_when(ts)}, "
            f"later than the requested start {_when(at)}: messages at or after that time may have been "
            "among them"
        )
        report_data_loss(fail_on_data_loss, lost_message(s, 0, removed, why))
        lost[s] = [0, removed]
    return lost


def broker_time_bounds(
    client: BrokerClient, streams: Sequence[str], times: Iterable[int], *, ended: Collection[int] = ()
) -> dict[int, dict[str, TimeBound]]:
    """Where each time (epoch ms) falls on each stream by the broker's clock: `TimeBound` per time
    and stream (`BrokerClient.time_bounds`: passed or not, and the offset there).

    `ended` holds the times the caller's own clock says have passed, and that clock decides nothing
    else: where one of them shows no chunk that late (an idle stream, where no message would show
    it), the broker is asked to timestamp one (`stamp_clock`, an offset-tracking entry that holds no
    message and moves no consumer), then asked again, and its answer decides. A caller whose clock
    is ahead of the broker's gets "not passed" all the same.
    """
    ordered = sorted(set(times))
    found = client.time_bounds(streams, ordered)
    idle = [
        s for s in streams if any(t in ended and not b.passed for t, b in zip(ordered, found[s], strict=True))
    ]
    if idle:
        log.info("asking the broker for its clock on %s (an offset-tracking entry)", idle)
        client.stamp_clock(idle)
        found.update(client.time_bounds(idle, ordered))
    return {t: {s: found[s][i] for s in streams} for i, t in enumerate(ordered)}


def open_on(at: Mapping[str, TimeBound]) -> dict[str, int | None]:
    """The streams on which a time has not passed, with their newest chunk's timestamp (None: empty)."""
    return {s: b.last_timestamp for s, b in at.items() if not b.passed}


def describe_open(end: datetime, still_open: Mapping[str, int | None]) -> str:
    """The broker's clock on streams where `end` has not passed: each one's newest chunk's time."""
    newest = []
    for s, ts in sorted(still_open.items()):
        if ts is None:
            newest.append(f"'{s}' is empty")
        else:
            at = datetime.fromtimestamp(ts / 1000, UTC)
            before = (end - at).total_seconds()
            newest.append(f"the newest chunk of '{s}' is timestamped {at.isoformat()}, {before:.1f} s before")
    return "; ".join(newest)


def check_time_end(
    client: BrokerClient,
    streams: Sequence[str],
    end: Position,
    now: datetime,
    *,
    start: Position | None = None,
) -> None:
    """Refuse a read whose end is a time the broker's clock has not reached (`OpenWindowError`).

    A time end resolves to the first chunk timestamped at or after it; before the broker's clock
    reaches it there is none, and the end would be the tails. The next range starts at that time,
    so a message timestamped before it that arrives after this run would be in neither: the range
    is refused instead, before anything is read. The error is retryable, as Dagster's open windows
    are (`dagster_rmqs.windows`): the end passes with time, and a retry then reads the whole range
    (Airflow's `retries` with a `retry_delay` wait it out). Waiting here instead was not chosen: how
    early a run starts is unbounded (a manual trigger, a catch-up, a worker's clock ahead), a wait
    would hold a worker slot for it and still need a refusal past its bound, and retries already
    wait visibly, with a delay the DAG chooses.

    Exact: an end that passed (a chunk at or after it, or the broker's clock stamped on an idle
    stream when `now`, the caller's clock, says it passed) costs one lookup per stream and changes
    no offset; an end that is not a time (offsets, "latest") is not looked at. The proof comes
    before the range is planned, so every chunk written after it is timestamped at or after the end
    and the tails the plan measures next are final for the range. A `start` in the future needs no
    check of its own: it resolves to the tails, and every message at or after it comes later, in
    the range of a later run; with a time end at or after it, that end is refused first.
    """
    if not is_timestamp(end):
        return
    at = to_millis(end)
    bounds = broker_time_bounds(client, streams, [at], ended=[at] if at <= to_millis(now) else [])[at]
    still_open = open_on(bounds)
    if not still_open:
        return
    when = datetime.fromtimestamp(at / 1000, UTC)
    span = f"[{_when(to_millis(start))}, {_when(at)})" if start is not None and is_timestamp(start) else None
    raise OpenWindowError(
        f"the read ends at {_when(at)}{f' (the range {span})' if span else ''}, which the broker's clock "
        f"has not reached ({describe_open(when, still_open)}): ended now, it would stop at the tails, "
        "and messages timestamped before the end that arrive later would be in neither this range nor "
        "the next. Nothing was read. Retry once the broker's clock passed the end (the error is "
        "retryable: retries with a delay wait it out), or run the range after it ended; a clock ahead "
        "of the broker's (the worker's, the scheduler's) starts such runs early"
    )


def merge_spans(*spans: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """Lost spans per stream (`[start, end]`), merged: one span from the lowest start to the highest end."""
    out: dict[str, list[int]] = {}
    for found in spans:
        for s, (lo, hi) in found.items():
            was = out.get(s)
            out[s] = [lo, hi] if was is None else [min(was[0], lo), max(was[1], hi)]
    return out


def _when(ms: int) -> str:
    """A broker time for a message: ISO 8601 in UTC, and the epoch milliseconds options take."""
    iso = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{iso} ({ms} ms)"


def stored_starts(client: BrokerClient, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
    """Next offsets from the broker-stored offsets of `consumer` (stored + 1), None where none."""
    stored = client.stored_offsets(consumer, list(streams))
    return {s: (v + 1 if v is not None else None) for s, v in stored.items()}
