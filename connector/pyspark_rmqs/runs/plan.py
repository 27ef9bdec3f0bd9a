"""A run's range, fixed before anything is read: resolved from read positions, or resumed from the run
record. This is where a retry finds its range.

`plan_range` is the first step of the watermark protocol (`steps.plan_read` calls it, under the
consumer's lease when the run stores its watermark). A watermark run whose consumer has an
unfinished run record resumes it whole (`_resumed`): the same ranges and token, whatever arrived or
was stored since, so any retry, on any worker, reads exactly the same rows. The record no longer
applies when its streams were deleted and created again (`_same_streams`) or when someone else
moved the watermark since it planned (`_moved_by_others`). Otherwise the positions (the watermark,
offsets, timestamps, earliest / latest) are resolved against the tails as they are now
(`broker.positions.resolve_positions`, the resolver the Spark readers use too), retention is
clamped (data loss reported) and `max_messages` caps the range. Metadata only: reads no message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.positions import (
    Bounds,
    Position,
    merge_spans,
    resolve_positions,
    timestamp_start_loss,
)
from pyspark_rmqs.core import offsets as off
from pyspark_rmqs.core.errors import lost_message, report_data_loss
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.incarnation import incarnations as incarnations_of
from pyspark_rmqs.runs.incarnation import same as same_incarnation
from pyspark_rmqs.runs.lease import Lease
from pyspark_rmqs.runs.outputs.delivery import RunToken
from pyspark_rmqs.runs.record import RunRecord
from pyspark_rmqs.runs.watermarks import Watermarks, watermarks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadPlan:
    """What one run reads: `[start, end)` per partition stream, fixed before reading.

    A run that stores its consumer's watermark also carries its run record (`runs.record`) and
    holds the consumer's lease (`runs.lease`) until it ends (`release`).
    """

    target: str
    superstream: bool
    consumer: str | None
    start: dict[str, int]
    end: dict[str, int]
    # The consumer's stored offsets when the run planned: storing checks nobody moved them since.
    seen: dict[str, int | None] = field(default_factory=dict)
    # True when this run resumes the record of an earlier, failed try (the same ranges and token).
    resumed: bool = False
    # Carried into the executors: a gap found while reading fails the run or is skipped and logged.
    fail_on_data_loss: bool = True
    # Each partition stream's incarnation (`runs.incarnation`): part of the token.
    incarnations: dict[str, int] = field(default_factory=dict)
    # The run record of a run that stores its watermark (None: a backfill, which stores nothing).
    record: RunRecord | None = field(default=None, compare=False)
    lease: Lease | None = field(default=None, compare=False, repr=False)
    # Offsets found lost while planning and skipped (failOnDataLoss=false): the summary's `data_loss`.
    data_loss: dict[str, list[int]] = field(default_factory=dict)
    # What retention removed from a resumed range since its record planned (`_resumed`): reported by
    # `report_retry_loss` when the run reads the range again, not when its output already holds it.
    retry_loss: dict[str, list[int]] = field(default_factory=dict)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        return {s: (self.start[s], self.end[s]) for s in self.start if self.end[s] > self.start[s]}

    @property
    def is_empty(self) -> bool:
        return not self.ranges

    @property
    def stores(self) -> bool:
        """Whether the run stores its consumer's watermark (a watermark run, not a backfill)."""
        return self.record is not None

    @property
    def mode(self) -> str:
        """`watermark` (stores the consumer's watermark when done) or `backfill` (stores nothing)."""
        return "watermark" if self.stores else "backfill"

    @property
    def delivered(self) -> bool:
        """A resumed run whose sink already succeeded: it only stores the watermark."""
        return self.record is not None and self.record.delivered

    @property
    def token(self) -> RunToken:
        """The run's identity for commits: consumer, ranges and stream incarnations."""
        if self.record is not None:
            return RunToken(self.consumer, run_record.ranges_of(self.record), self.record.incarnations)
        return RunToken(
            self.consumer,
            self.ranges,
            {s: self.incarnations[s] for s in self.ranges if s in self.incarnations},
        )

    @property
    def stream_target(self) -> Target:
        """The stream or super stream planned, as the one `Target` value."""
        return Target(self.target, self.superstream)

    @property
    def offsets_span(self) -> int:
        """Offsets covered (an upper bound on rows: offset-tracking entries take offsets too)."""
        return sum(e - s for s, e in self.ranges.values())

    def release(self) -> None:
        """Give back the consumer's lease (a run's last step; idempotent)."""
        if self.lease is not None:
            self.lease.release()


def plan_range(
    conn: ConnectionOptions,
    target: Target,
    consumer: str | None,
    start: Position,
    end: Position,
    max_messages: int | None,
    starting_offsets: str,
    fail_on_data_loss: bool,
    previous: RunRecord | None,
    *,
    resume: bool = False,
    stores: bool = False,
) -> ReadPlan:
    """The plan itself: resume `previous` when it is unfinished, else resolve the positions.

    A run that `stores` watermarks marks streams without an incarnation (it writes offsets into
    them anyway); any other plan only reads the markers: a backfill writes nothing into its streams.
    """
    w = watermarks(conn, consumer or "", **target.kw())
    seen = w.stored_offsets()
    # A watermark run marks streams without an incarnation (it stores offsets in them anyway).
    incarnations = incarnations_of(conn, [p.stream for p in w.partitions], mark=stores)
    usable = previous if previous is not None and _same_streams(previous, w.target, incarnations) else None
    if previous is not None and usable is None:
        log.warning(
            "the run record of consumer '%s' on '%s' was planned on streams since deleted and created "
            "again: it no longer applies",
            consumer,
            previous.target,
        )
    if resume and usable is not None and not usable.done and not _moved_by_others(usable, seen, consumer):
        log.info("consumer '%s' has an unfinished run (%s): resuming it whole", consumer, usable.holder())
        return _resumed(w, usable, incarnations, fail_on_data_loss)
    client = BrokerClient(conn)
    b = Bounds({p.stream: p.first for p in w.partitions}, {p.stream: p.tail for p in w.partitions})
    stored: dict[str, int | None] | None = None
    recorded: dict[str, int] = {}
    if consumer:
        stored = dict(seen)
        if usable is not None:  # where the record leaves the consumer, on partitions storing nothing
            recorded = _recorded_positions(usable, seen)
    starts = resolve_positions(client, b, start, is_end=False, stored=stored, fallback=starting_offsets)
    lost = timestamp_start_loss(client, b, start, fail_on_data_loss)
    if isinstance(start, str) and start == "watermark":
        starts.update({s: v for s, v in recorded.items() if s in starts})
        if previous is not None or any(v is not None for v in seen.values()):
            starts.update(_new_partitions(seen, recorded, starts))
    ends = resolve_positions(client, b, end, is_end=True)
    for p in w.partitions:
        s = p.stream
        if starts[s] < p.first and ends[s] > starts[s]:
            gone = [starts[s], min(p.first, ends[s])]
            report_data_loss(
                fail_on_data_loss, lost_message(s, gone[0], gone[1], "retention removed them before this run")
            )
            lost = merge_spans(lost, {s: gone})  # skipped: the summary's `data_loss` says so
        starts[s] = max(starts[s], p.first)
        ends[s] = max(starts[s], min(ends[s], p.tail))
    if max_messages is not None:
        ends = off.apply_limit(starts, ends, max_messages)
    return ReadPlan(
        w.target,
        w.superstream,
        consumer,
        starts,
        ends,
        seen,
        False,
        fail_on_data_loss,
        incarnations,
        data_loss=lost,
    )


def _recorded_positions(record: RunRecord, seen: Mapping[str, int | None]) -> dict[str, int]:
    """Where `record` leaves its consumer on each partition stream with no stored offset (never
    stored, or forgotten by the broker once retention passed it): a range's end once its sink
    succeeded (`delivered` or `stored`), its start while the record is only `planned`.

    An unfinished record planned anew (someone moved another partition's watermark) did not deliver
    its ranges: starting past them would skip them silently. An exactly-once output that committed
    them before the try died skips what it holds (`consume`'s committed spans); an at-least-once sink
    reads them again, as any retry does.
    """
    return {s: (r[1] if record.delivered else r[0]) for s, r in record.ranges.items() if seen.get(s) is None}


def _new_partitions(
    seen: Mapping[str, int | None], recorded: Mapping[str, int], starts: Mapping[str, int]
) -> dict[str, int]:
    """Where a consumer that has run before starts on partition streams it has never seen: offset 0.

    `starting_offsets` ("earliest" / "latest") places a consumer's first run. A partition stream
    bound to the super stream after that run, or a stream deleted and created again since (its
    stored offsets went with it, and its record no longer applies), began after the consumer did:
    everything in it is new to the consumer, as Spark's Kafka source reads partitions added to a
    topic from their start. Planning clamps 0 to the first offset retention kept (data loss).
    """
    new = {s: 0 for s in starts if seen.get(s) is None and s not in recorded}
    if new:
        log.info("partition stream(s) %s are new to the consumer: read from their start", sorted(new))
    return new


def _resumed(w: Watermarks, record: RunRecord, incarnations: dict[str, int], fail: bool) -> ReadPlan:
    """The plan of an unfinished record: its ranges exactly, whatever arrived or was stored since.

    What retention removed from a range since the record was written is data loss only if the retry
    must read it again: not when the record says `delivered` (the sink already had the range: the
    retry only stores), nor when the run's exactly-once output committed it before the try died (a
    Parquet commit record, the run's token in an Iceberg table), which only the run step can tell.
    So it is kept in `retry_loss` and reported by `report_retry_loss` when the run reads (with
    failOnDataLoss=false the reader skips it). The token stays the record's.
    """
    starts = {s: r[0] for s, r in record.ranges.items()}
    ends = {s: r[1] for s, r in record.ranges.items()}
    firsts = {p.stream: p.first for p in w.partitions}
    delivered = record.delivered
    gone: dict[str, list[int]] = {}
    for s in starts:
        first = firsts.get(s)
        if first is None and ends[s] > starts[s]:  # a partition of the record vanished
            report_data_loss(fail, lost_message(s, starts[s], ends[s], "the partition stream is gone"))
            ends[s] = starts[s]
        elif first is not None and starts[s] < first and ends[s] > starts[s] and not delivered:
            gone[s] = [starts[s], min(first, ends[s])]
    return ReadPlan(
        w.target,
        w.superstream,
        record.consumer,
        starts,
        ends,
        dict(record.seen),
        True,
        fail,
        incarnations,
        record,
        retry_loss=gone,
    )


def report_retry_loss(plan: ReadPlan, held: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> None:
    """Report what retention removed from a resumed range (`ReadPlan.retry_loss`), as the run is about
    to read that range again; offsets its output already holds (`held`: spans earlier runs of the
    consumer committed there) are not lost. With failOnDataLoss=false: logged (the reader skips them
    and names them in `RangeReader.lost`)."""
    for s, (lo, hi) in plan.retry_loss.items():
        span = _outside(lo, hi, (held or {}).get(s, ()))
        if span is not None:
            why = "retention removed them before this retry"
            report_data_loss(plan.fail_on_data_loss, lost_message(s, span[0], span[1], why))


def _outside(lo: int, hi: int, spans: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """The smallest span holding every offset of `[lo, hi)` that no span of `spans` covers (None: all
    covered)."""
    for a, b in sorted(spans):
        if a <= lo < b:
            lo = b
    for a, b in sorted(spans, reverse=True):
        if a < hi <= b:
            hi = a
    return (lo, hi) if lo < hi else None


def _moved_by_others(record: RunRecord, seen: Mapping[str, int | None], consumer: str | None) -> bool:
    """Whether someone else moved a watermark since `record` planned (neither the run's own store
    nor the value it saw): its plan is stale, and storing its end would fail anyway."""
    moved = {
        s: (record.seen.get(s), now)
        for s, now in seen.items()
        if s in record.ranges and now not in (record.seen.get(s), record.ranges[s][1] - 1)
    }
    if moved:
        log.warning(
            "consumer '%s': the watermark moved since its unfinished run planned (%s): planning anew",
            consumer,
            moved,
        )
    return bool(moved)


def _same_streams(record: RunRecord, target: str, incarnations: Mapping[str, int]) -> bool:
    """Whether `record` was planned on these very streams (same target, no partition re-created)."""
    if record.target != target:
        return False
    return all(same_incarnation(v, incarnations.get(s, v)) for s, v in record.incarnations.items())
