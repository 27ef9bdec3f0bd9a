"""Rules on retention and on time positions: what users meet when a stream is truncated under a
consumer, and when they read by time (Airflow's `data_interval_start` / `data_interval_end`).

Retention (`truncate`): every stream of a sequence has tiny segments (`broker_ops.SEGMENT_BYTES`);
the rule publishes two chunks bigger than a segment straight to one stream (the data before them is
in closed segments then), sets a `max-length-bytes` policy on it (management API), which deletes
every segment but the one being written, waits until the first offset moved, and removes it. The
messages below the new first offset are then unreadable. For a consumer that never planned a
storing run on the target and stores no watermark there, its first run starts at the first offset
kept: they were never its to lose. Any other consumer that had not read them still owes them
(`PipelineModel.lost`) until a run reports them (`DataLossError` names the offsets, a
`failOnDataLoss=false` run's summary lists them in `data_loss`): a run that passes over them
silently breaks invariant (a) (a watermark past them, a promise it cannot keep, or the final
check). `run_skipping_loss` is the user's answer to a
`DataLossError`: the same run with `fail_on_data_loss=False`.

Time positions (`backfill_by_time`, `timed_run`): RabbitMQ timestamps chunks, not messages, when it
writes them, on this machine's clock. The model keeps each publish call's clock window
(`Message.published`) and only uses times no window holds (`Model.gaps`): there, "published
before" and "published after" split every partition exactly, whichever chunk a message landed in,
as tests/airflow/test_time_intervals.py reasons with the broker's clock. An end in the future
must be refused (`OpenWindowError`: issue 42 case 3), or, if a connector waits for it instead, the
run must return after it with exactly the interval.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.campaign.faults import CLOCK_SKEWS_MS, Hooks, SinkFailure, local_clock, sink_hooks
from tests.campaign.harness import AIRFLOW_PIPELINES, PIPELINES, STATS, STREAM_KEYS, CampaignBase
from tests.campaign.invariants import Violation, check_backfill_stored_nothing, check_failure
from tests.campaign.model import Message, PipelineModel
from tests.campaign.runs import Attempt, Row, execute

ROLL_MESSAGES = 40  # one publish of these is a chunk bigger than a segment (broker_ops.SEGMENT_BYTES)
FUTURE_MS = 120_000  # how far ahead an end "in the future" is
END_KINDS = ("past", "past", "latest", "future")


def now_ms() -> int:
    return int(time.time() * 1000)


def rendered(ms: int) -> str:
    """A time as Airflow renders `{{ data_interval_start }}` into a templated field."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


class RetentionAndTimeRules(CampaignBase):
    """`truncate`, `run_skipping_loss`, `backfill_by_time`, `timed_run` (see the module docstring)."""

    def _roll(self, target: str, stream: str) -> None:
        """Two publishes straight to partition stream `stream` of `target`, each a chunk bigger than a
        segment: the data before them is in closed segments now, and the new segment's tracking
        snapshot leaves out every stored offset below the first offset (on `ss`, not hash routed:
        nothing checks that)."""
        for _ in range(2):
            self._publish_direct(target, stream, ROLL_MESSAGES)

    @rule(stream=st.sampled_from(STREAM_KEYS), before=st.integers(0, 30))
    def truncate(self, stream: str, before: int) -> None:
        """Retention removes the head of a stream: `before` messages more first, then a
        segment rolled twice, a `max-length-bytes` policy until the first offset moved, removed."""
        if not self._step("truncate"):
            return
        name = self._stream(stream)
        if name is None or not self.model.partitions[name].exists:
            return self._skip("truncate-missing")
        target = next(t.key for t in self.model.targets.values() if name in t.partitions)
        if before:
            self._publish(target, before)
        part = self.model.partitions[name]
        was = part.first
        self._roll(target, name)
        # One retention evaluation, with nothing written while the policy is set: osiris evaluates
        # retention asynchronously, and an evaluation still queued when the policy goes would cut
        # segments written after it (a roll under the policy queues one more).
        self.ops.set_retention(name, 1)
        try:
            moved = self._first_moved(name, was)
        finally:
            self.ops.clear_retention(name)
        first = self.ops.settled_first(name, stable_s=0.15)
        if not moved and first <= was:
            return self._skip("truncate-nothing-removed")
        if first < was:
            raise Violation("model", f"{name}'s first offset moved back, {was} -> {first}")
        gone = self.model.truncate(name, first)
        STATS["truncated_messages"] += len(gone)
        if not gone:
            return self._skip("truncate-nothing-removed")
        for p in self.model.pipelines_of(target):
            self._lose(p, name, gone)
        self._touch(target)

    def _first_moved(self, stream: str, was: int, wait_s: float = 5.0) -> bool:
        deadline = time.monotonic() + wait_s
        while self.ops.firsts([stream])[stream] <= was:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _lose(self, p: PipelineModel, stream: str, gone: list[Message]) -> None:
        """What retention removed before `p` read it: a loss its next run must report, unless `p`
        has no position on the target (its first run starts at the first offset kept)."""
        counts = Counter(body for body, _, _ in self._rows(p))
        unread = [m for m in gone if not counts[m.body] and self.model.owed(p, m)]
        if not unread:
            return
        positioned = p.planned_ever or self._stored(p).get(stream) is not None
        if positioned and not p.planned_ever and self._avoided("evicted-watermark-silent"):
            positioned = False  # its stored watermark alone, which the broker drops: not reported
        if positioned:
            p.lost.update(m.body for m in unread)
            STATS["lost_owed"] += len(unread)
        else:
            self.model.excuse(p, unread)

    @rule(pipeline=st.sampled_from(PIPELINES))
    def run_skipping_loss(self, pipeline: str) -> None:
        """A watermark run with `fail_on_data_loss=False` (a user accepting a reported loss): it must
        name in its summary's `data_loss` whatever retention removed from its range."""
        if self._step("run_skipping_loss"):
            self._watermark_run(pipeline, lenient=True)

    # --------------------------------------------------------------------------------- time

    def _times(
        self, p: PipelineModel, start_at: int, end_kind: str, end_at: int
    ) -> tuple[int, int | None, dict[str, int]] | None:
        """(start, end or None for "latest", tails) for a time range on `p`'s target, both in gaps
        between publish calls; None (a no-op) where it does not apply."""
        t = self._target(p)
        if not self.model.target_exists(p.target):
            self._skip("time-missing")
            return None
        tails = self.ops.tails(t.partitions)
        if any(tails[s] == 0 for s in t.partitions):
            # A time end on an idle stream has the broker stamp its clock into it (an offset-tracking
            # entry): on an empty stream, before RabbitMQ 4.3, every later tail lookup then waits out
            # a 1.5 s probe. Not what this rule is about.
            self._skip("time-on-empty")
            return None
        now = now_ms()
        gaps = self.model.gaps(now)
        if not gaps:
            self._skip("time-no-gap")
            return None
        start = gaps[start_at % len(gaps)]
        later = [g for g in gaps if g > start]
        if end_kind == "future":
            return start, now + FUTURE_MS, tails
        if end_kind == "past" and later:
            return start, later[end_at % len(later)], tails
        return start, None, tails

    def _in_range(self, streams: list[str], start: int, end: int | None) -> list[Message]:
        """Kept messages published within `[start, end)`."""
        return [
            m
            for s in streams
            for m in self.model.published_between(s, start, end)
            if not self.model.truncated(m)
        ]

    def _refused_open(self, p: PipelineModel, attempt: Attempt, end: int, what: str) -> bool:
        """An end in the future: refused (`OpenWindowError`), or the run waited for it. True when
        refused (nothing more to check)."""
        if attempt.error_class == "OpenWindowError":
            STATS["time_open_refused"] += 1
            return True
        if attempt.ok and now_ms() < end:
            raise Violation(
                "a",
                f"{what} of {p.key} ending at {rendered(end)}, which the broker's clock had not reached, "
                f"succeeded before it ({attempt.describe()}): a message timestamped before the end that "
                "arrives later is in neither this range nor the next",
            )
        return False

    @rule(
        pipeline=st.sampled_from(PIPELINES),
        start_at=st.integers(0, 1000),
        end_kind=st.sampled_from(END_KINDS),
        end_at=st.integers(0, 1000),
        skew=st.sampled_from(CLOCK_SKEWS_MS),
    )
    def backfill_by_time(self, pipeline: str, start_at: int, end_kind: str, end_at: int, skew: int) -> None:
        """A backfill from a time to a time (in the past or in the future) or to `latest`: it reads
        exactly the messages published in the range (or reports retention's loss), stores nothing;
        the run's clock `skew` ms ahead of or behind the broker's."""
        if not self._step("backfill_by_time"):
            return
        p = self.model.pipelines[pipeline]
        found = self._times(p, start_at, end_kind, end_at)
        if found is None:
            return
        start, end, tails = found
        t = self._target(p)
        before = self._stored(p)
        rows: list[Row] = []
        hooks = Hooks()
        STATS[f"clock_skew:{skew}"] += 1
        with sink_hooks(hooks), local_clock(skew):
            attempt = execute(
                t,
                p,
                output=None,
                hooks=hooks,
                rows=rows,
                started_seq=self.model.seq,
                kind="backfill",
                start=rendered(start),
                end="latest" if end is None else rendered(end),
            )
        STATS[f"outcome:backfill_by_time:{end_kind}:{attempt.label}"] += 1
        check_failure(p, attempt, None)
        check_backfill_stored_nothing(p, before, self._stored(p))
        what = f"a backfill over [{rendered(start)}, {rendered(end) if end else 'latest'})"
        if end_kind == "future" and self._refused_open(p, attempt, end or 0, what):
            if rows:
                raise Violation("a", f"{what} of {p.key} was refused but delivered {len(rows)} rows")
            return
        # Retention removed messages published in the range: the start's loss must be reported.
        removed = [
            m
            for s in t.partitions
            for m in self.model.published_between(s, start, end)
            if self.model.truncated(m)
        ]
        truncated = any(self.model.partitions[s].first > 0 for s in t.partitions)
        if attempt.data_loss:
            if not truncated:
                raise Violation(
                    "d", f"{what} of {p.key} reported a loss, none happened: {attempt.describe()}"
                )
            return
        if not attempt.ok:
            return
        if removed:
            raise Violation(
                "a",
                f"{what} of {p.key} succeeded without reporting the {len(removed)} message(s) retention "
                f"removed from it ({attempt.describe()})",
            )
        wanted = {
            m.body
            for m in self._in_range(t.partitions, start, end)
            if m.offset is not None and m.offset < tails[m.stream]
        }
        got = Counter(body for body, _, _ in rows)
        if set(got) != wanted or any(n > 1 for n in got.values()):
            foreign, missing = sorted(set(got) - wanted), sorted(wanted - set(got))
            raise Violation(
                "a",
                f"{what} of {p.key} read {len(got)} messages, {len(wanted)} expected (foreign "
                f"{[b.decode() for b in foreign[:5]]}, missing {[b.decode() for b in missing[:5]]})",
            )

    @rule(
        pipeline=st.sampled_from(AIRFLOW_PIPELINES),
        start_at=st.integers(0, 1000),
        end_kind=st.sampled_from(END_KINDS),
        end_at=st.integers(0, 1000),
        fail=st.sampled_from((False, False, True)),
        skew=st.sampled_from(CLOCK_SKEWS_MS),
    )
    def timed_run(
        self, pipeline: str, start_at: int, end_kind: str, end_at: int, fail: bool, skew: int
    ) -> None:
        """A storing run over a time range (`store_watermark=True`, the interval's task) into the
        consumer's own output; with `fail`, its sink fails once and it is retried. What lies between
        the watermark and the start is skipped on purpose; its ends are where the times fall. The
        run's clock is `skew` ms ahead of or behind the broker's."""
        if not self._step("timed_run"):
            return
        STATS[f"clock_skew:{skew}"] += 1
        with local_clock(skew):
            self._timed_run(pipeline, start_at, end_kind, end_at, fail)

    def _timed_run(self, pipeline: str, start_at: int, end_kind: str, end_at: int, fail: bool) -> None:
        p = self.model.pipelines[pipeline]
        if not self._may_run(p):
            return self._skip("timed-not-applicable")
        found = self._times(p, start_at, end_kind, end_at)
        if found is None:
            return
        start, end, tails = found
        t = self._target(p)
        stored = self._stored(p)
        kw: dict[str, Any] = {
            "kind": "timed",
            "start": rendered(start),
            "end": "latest" if end is None else rendered(end),
            "store_watermark": True,
        }
        what = f"a storing run over [{kw['start']}, {kw['end']})"
        first = self._attempt(p, Hooks(fail_after=0 if fail else None), **kw)
        if end_kind == "future":
            check_failure(p, first, None)
            STATS[f"outcome:timed:{first.label}"] += 1
            if self._refused_open(p, first, end or 0, what):
                if self._stored(p) != stored:
                    raise Violation("c", f"{what} of {p.key} was refused but moved its watermarks")
                return
        after = {s: -1 if (v := stored.get(s)) is None else v for s in t.partitions}
        skipped = [
            m
            for s in t.partitions
            for m in self.model.partitions[s].messages
            if m.offset is not None and m.offset > after[s] and m.published[1] < start
        ]
        if first.ok or isinstance(first.error, SinkFailure):  # planned: its start skipped them
            self.model.excuse(p, skipped)
        self._settle(p, first, SinkFailure if fail else None)
        if first.ok and not first.resumed and end is not None:
            self._check_ends(p, first, end, tails, what)
        if not first.ok and not first.data_loss:
            retry = self._attempt(p, Hooks(), **kw)
            if retry.ok:
                self.model.excuse(p, skipped)
            self._settle(p, retry, None)

    def _check_ends(
        self, p: PipelineModel, attempt: Attempt, end: int, tails: dict[str, int], what: str
    ) -> None:
        """A time end resolves, per partition, to the first message published at or after it (the
        tail when none is)."""
        for s in self._target(p).partitions:
            after = [m.offset for m in self.model.published_between(s, end, None) if m.offset is not None]
            wanted = max(min(after, default=tails[s]), self.model.partitions[s].first)
            if attempt.ends.get(s) != wanted:
                raise Violation(
                    "a",
                    f"{what} of {p.key} ended {s} at {attempt.ends.get(s)}, where the first message "
                    f"published after the end is {wanted} ({attempt.describe()})",
                )
