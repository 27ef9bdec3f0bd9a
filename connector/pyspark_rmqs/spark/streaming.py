"""Structured Streaming micro-batch reads: admission control, AvailableNow, best-effort broker commits.

The driver-side runner owns offsets; executors only see what `partitions()` puts in each
InputPartition. Spark's checkpoint is the source of truth: `commit(end)` stores the last committed
offset per partition stream in the broker in the background, as metadata that never gates Spark;
with `minPartitions`, that offset is the merge of the batch's splits (DESIGN §6).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.positions import (
    Bounds,
    bounds,
    check_version,
    partition_streams,
    report_data_loss,
    starting_offsets,
    stored_starts,
)
from pyspark_rmqs.core import offsets as off
from pyspark_rmqs.core.errors import RmqsError, lost_message
from pyspark_rmqs.options import SourceOptions
from pyspark_rmqs.spark.common import RangePartition, read_partition, to_partitions
from pyspark_rmqs.spark.compat import (
    ADMISSION_CONTROL,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    needs_admission_control,
)

log = logging.getLogger(__name__)

TAIL_TTL_S = 0.5  # Spark polls latestOffset ~30 times a second when idle
PARTITIONS_TTL_S = 30.0
COMMIT_TIMEOUT_S = 30.0
COMMIT_WAIT_S = 5.0
MAX_PLANS = 16  # planned batches kept until committed; Spark has at most a couple outstanding


class _Metadata:
    """Briefly cached partitions, first offsets and tails (driver side)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.client = BrokerClient(opts.connection)
        self._streams: list[str] = []
        self._streams_at = 0.0
        self._tails: dict[str, int] = {}
        self._firsts: dict[str, int] = {}
        self._tails_at = 0.0
        self.sizes: dict[str, float] = {}

    def streams(self) -> list[str]:
        if not self._streams or time.monotonic() - self._streams_at > PARTITIONS_TTL_S:
            self._streams = partition_streams(self.client, self.opts)
            self._streams_at = time.monotonic()
        return self._streams

    def refresh(self, force: bool = False) -> tuple[dict[str, int], dict[str, int]]:
        if force or time.monotonic() - self._tails_at > TAIL_TTL_S:
            b = bounds(self.client, self.streams(), self.opts.fail_on_data_loss)
            self._firsts, self._tails = b.first, b.tail
            self._tails_at = time.monotonic()
            self.sizes = self.client.message_sizes()
        return self._firsts, self._tails


class RabbitMQStreamsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        if not ADMISSION_CONTROL:
            if opts.max_records_per_trigger is not None:
                raise needs_admission_control(opts.alias("max_records_per_trigger"))
            if opts.max_bytes_per_trigger is not None:
                raise needs_admission_control(opts.alias("max_bytes_per_trigger"))
        self.opts = opts
        self._meta: _Metadata | None = None
        # PySpark < 4.2 calls latestOffset() without the batch's start: the last end returned.
        self._last_end: dict[str, int] = {}
        self._snapshot: dict[str, int] | None = None
        self._avg_size = float(opts.estimated_message_size_bytes)
        self._commit_thread: threading.Thread | None = None
        # Batches planned in this process, by their end offsets: (planned starts, splits).
        self._plans: dict[str, tuple[dict[str, int], list[off.OffsetRange]]] = {}

    # -- driver side ---------------------------------------------------------------------------

    @property
    def meta(self) -> _Metadata:
        if self._meta is None:
            self._meta = _Metadata(self.opts)
            check_version(self._meta.client, self.opts)
        return self._meta

    def initialOffset(self) -> dict[str, int]:
        """No checkpoint yet: the broker-stored offsets of `consumerName`, else `startingOffsets`.

        `startingOffsets` is resolved (and a timestamp start checked for data loss) only for the
        streams that have no stored offset.
        """
        firsts, tails = self.meta.refresh(force=True)
        resumed: dict[str, int] = {}
        if self.opts.consumer_name:
            # Lookup errors (authentication, connection) fail: an explicit name must not be ignored.
            stored = stored_starts(self.meta.client, self.opts.consumer_name, list(tails))
            for s, v in stored.items():
                if v is not None:
                    resumed[s] = v
                    log.info(
                        "resuming '%s' from the offset stored for '%s': %d", s, self.opts.consumer_name, v
                    )
        fresh = [s for s in tails if s not in resumed]
        b = Bounds({s: firsts[s] for s in fresh}, {s: tails[s] for s in fresh})
        configured = starting_offsets(self.meta.client, self.opts, b) if fresh else {}
        return self._clamp({s: resumed[s] if s in resumed else configured[s] for s in tails}, firsts)

    def _clamp(self, start: dict[str, int], firsts: dict[str, int]) -> dict[str, int]:
        out = dict(start)
        for s, v in start.items():
            first = firsts.get(s, 0)
            if v < first:
                report_data_loss(
                    self.opts.fail_on_data_loss,
                    lost_message(s, v, first, "retention removed them before they were read"),
                )
                out[s] = first
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Snapshot the tails: an AvailableNow query drains to here and stops, whatever arrives later."""
        _, tails = self.meta.refresh(force=True)
        self._snapshot = dict(tails)
        log.info("AvailableNow: draining '%s' to %s", self.opts.name, off.offsets_to_json(self._snapshot))

    def _targets(self) -> dict[str, int]:
        _, tails = self.meta.refresh()
        if self._snapshot is None:
            return dict(tails)
        # New partitions after the snapshot are not part of this run.
        return {s: min(t, self._snapshot[s]) for s, t in tails.items() if s in self._snapshot}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        """The end of the next micro-batch. PySpark 4.2+ passes the batch's start and the read limit
        (admission control); PySpark 4.0 and 4.1 pass neither: the start is then the last end this
        reader returned (none after a restart: the tails), and every batch reads all available."""
        if start is None:
            start = self._last_end
        if limit is None:
            limit = ReadAllAvailable()
        start = self._recreated_from_first(self._without_lost_partitions(self._with_new_partitions(start)))
        targets = self._targets()
        starts = {s: start[s] for s in targets if s in start}
        ends = {s: max(starts[s], targets[s]) for s in starts}
        max_rows = self._row_budget(limit)
        if max_rows is not None:
            ends = off.apply_limit(starts, ends, max_rows)
        result = dict(start)
        result.update(ends)
        self._last_end = dict(result)
        return result

    def _row_budget(self, limit: ReadLimit) -> int | None:
        """Rows allowed in this micro-batch; the most restrictive of the engine's and our limits."""
        sizes = self.meta.sizes
        if sizes:  # running average message size, from the chunks the tail probes saw
            self._avg_size = 0.8 * self._avg_size + 0.2 * (sum(sizes.values()) / len(sizes))
        if isinstance(limit, ReadAllAvailable):
            return None
        budgets = []
        if isinstance(limit, ReadMaxRows):
            budgets.append(limit.max_rows)
        if isinstance(limit, ReadMaxBytes):
            budgets.append(off.rows_for_bytes(limit.max_bytes, self._avg_size))
        if self.opts.max_records_per_trigger is not None:
            budgets.append(self.opts.max_records_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            budgets.append(off.rows_for_bytes(self.opts.max_bytes_per_trigger, self._avg_size))
        return min(budgets) if budgets else None

    def _with_new_partitions(self, start: dict[str, int]) -> dict[str, int]:
        """Partitions added to a super stream since the checkpoint start at offset 0, as Spark's Kafka
        source reads an added partition: what retention removed from one before this query read it
        is data loss (`partitions` clamps and reports), never skipped by starting at its first
        offset kept (found by the campaign: a drain's new partition truncated before the next drain,
        76 messages in no output and no error)."""
        firsts, _ = self.meta.refresh()
        out = dict(start)
        for s in firsts:
            if s not in out:
                log.info("new partition stream '%s': reading it from offset 0", s)
                out[s] = 0
        return out

    def _without_lost_partitions(self, start: dict[str, int]) -> dict[str, int]:
        """Partition streams in the checkpoint that no longer exist: data loss (fail, or drop them)."""
        firsts, _ = self.meta.refresh()
        gone = sorted(s for s in start if s not in firsts)
        for s in gone:
            report_data_loss(
                self.opts.fail_on_data_loss,
                f"partition stream '{s}' of '{self.opts.name}' no longer exists (was at offset {start[s]})",
            )
        return {s: v for s, v in start.items() if s in firsts}

    def _recreated_from_first(self, start: dict[str, int]) -> dict[str, int]:
        """A stream whose tail is below the checkpoint's offset was deleted and created again (a
        stream's tail never goes back): data loss (fail, or read the new stream from its first offset).

        Without this, the query waited for the new stream to pass the old one's end and then read
        only what came after it: its first messages in no output, no error. A new stream that grew
        past the old end before the next batch is not seen here; rmqs's drains keep the streams'
        identity beside the checkpoint for that (`runs.checkpoint_streams`).
        """
        firsts, tails = self.meta.refresh()
        out = dict(start)
        for s, v in start.items():
            if s in tails and v > tails[s]:
                report_data_loss(
                    self.opts.fail_on_data_loss,
                    f"partition stream '{s}' of '{self.opts.name}' ends at offset {tails[s]}, below the "
                    f"checkpoint's {v}: it was deleted and created again since the checkpoint read it, and "
                    "the new stream's messages below that offset would be skipped",
                )
                out[s] = firsts.get(s, 0)
        return out

    def reportLatestOffset(self) -> dict[str, int] | None:
        _, tails = self.meta.refresh()
        return dict(tails)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if not ADMISSION_CONTROL:
            # PySpark < 4.2 gave latestOffset no start (after a restart it knew none): the checks
            # for deleted and re-created streams that it runs there on 4.2+ run here, on the real start.
            start = self._recreated_from_first(self._without_lost_partitions(start))
        firsts, _ = self.meta.refresh()
        # A start past its end: the stream was re-created (reported by latestOffset); from its first.
        starts = {s: (v if v <= end[s] else firsts.get(s, 0)) for s, v in start.items() if s in end}
        for s in end:  # a partition added since `start` (`_with_new_partitions`): from offset 0
            starts.setdefault(s, 0)
        starts = self._clamp({s: v for s, v in starts.items() if s in firsts or v >= end[s]}, firsts)
        missing = [s for s in end if s not in firsts and end[s] > start.get(s, 0)]
        for s in missing:
            report_data_loss(self.opts.fail_on_data_loss, f"partition stream '{s}' no longer exists")
        starts = {s: v for s, v in starts.items() if s not in missing}
        splits = off.split_ranges(off.plan_ranges(starts, end), self.opts.min_partitions)
        self._remember(end, starts, splits)
        return to_partitions(splits)

    def _remember(self, end: dict[str, int], starts: dict[str, int], splits: list[off.OffsetRange]) -> None:
        key = off.offsets_to_json(end)
        self._plans.pop(key, None)  # planned again (a retried batch): the latest plan is the one run
        self._plans[key] = (dict(starts), list(splits))
        while len(self._plans) > MAX_PLANS:
            del self._plans[next(iter(self._plans))]

    def committed_offsets(self, end: dict[str, int]) -> dict[str, int]:
        """Next offset per stream once the batch ending at `end` is committed: its splits, merged.

        Spark commits a batch to its source only after every task of the batch succeeded, so each
        split planned for it is complete (committed = its end) and the merge of SPEC's "Split offset
        merge" gives the stream's next offset; a stream without splits (nothing to read) is at `end`.

        The splits are known only for batches planned by this runner: after a restart, Spark may
        commit a batch that an earlier process planned, and this process never saw its
        `partitions()`. Then the result is `end` itself, which is what Spark committed for the whole
        batch (its checkpoint says so too), rather than guessing at splits that are not known.
        Plans planned before the committed one are forgotten with it.
        """
        key = off.offsets_to_json(end)
        if key not in self._plans:
            log.debug("batch ending at %s was not planned by this runner: committing its end", key)
            return dict(end)
        for k in list(self._plans):  # insertion order: this batch and the ones planned before it
            plan = self._plans.pop(k)
            if k == key:
                starts, splits = plan
                break
        out: dict[str, int] = {}
        for s, e in end.items():
            results = [(r.start, r.end, r.end) for r in splits if r.stream == s]
            if not results:
                out[s] = e
                continue
            merged = off.merge_committed_splits(starts[s], results)
            if merged != e:
                log.warning(
                    "the splits of stream '%s' planned for this batch merge to %d, not its end %d: "
                    "storing %d",
                    s,
                    merged,
                    e,
                    merged,
                )
            out[s] = merged
        return out

    def commit(self, end: dict[str, int]) -> None:
        """Store the last committed offset per stream for `consumerName` (best effort, bounded wait,
        never raises): the batch's merged splits (`committed_offsets`) minus one, never below what
        is stored (a query restarted from an older checkpoint does not move the watermark back)."""
        nexts = self.committed_offsets(end)
        if not (self.opts.server_side_offset_tracking and self.opts.consumer_name):
            return
        last = {s: v - 1 for s, v in nexts.items() if v > 0}
        if not last:
            return
        previous = self._commit_thread
        if previous is not None and previous.is_alive():
            previous.join(COMMIT_TIMEOUT_S)  # keep stores in order; never more than one behind
        consumer = self.opts.consumer_name
        client = self.meta.client

        def store() -> None:
            try:
                client.store_offsets_forward(consumer, last)
            except (RmqsError, OSError) as e:
                log.warning(
                    "could not store offsets of '%s' in the broker (Spark's checkpoint is unaffected): %s",
                    consumer,
                    e,
                )

        t = threading.Thread(target=store, name="rmqs-store-offsets", daemon=True)
        t.start()
        self._commit_thread = t
        # Usually done in milliseconds: wait that long, so the last commit of a run is stored before
        # Spark tears the runner down; a slow broker only delays the next commit, never blocks it.
        t.join(COMMIT_WAIT_S)

    def stop(self) -> None:
        t = self._commit_thread
        if t is not None and t.is_alive():
            t.join(COMMIT_TIMEOUT_S)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_meta"] = None
        state["_commit_thread"] = None
        state["_plans"] = {}
        return state

    # -- executor side -------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangePartition):  # Spark adds an InputPartition(None) to an empty plan
            yield from read_partition(self.opts, partition)
