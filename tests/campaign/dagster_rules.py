"""Dagster's partitioned assets: offset-range keys and time windows (`build_stream_asset(engine="arrow",
partitions_def=...)`), materialized through `materialize()` as the watermark consumer c5 is.

- `dagster_ranges`: dynamic offset-range keys (`offset_range_key(stream, start, end)`), from a
  quarter of each partition stream's tail to the tail, each materialized into one output folder:
  the folder holds exactly the messages of those ranges, each once; no watermark moves.
- `dagster_window`: a one-minute `TimeWindowPartitionsDefinition` (the current window a partition
  too, `end_offset=1`): the window of the target's first or last message, or the one now (open),
  under a local clock ahead of, behind or equal to the broker's. Its folder
  (`rmqs_window=<key>`) holds each message at most once, every message whose publish call lay
  inside the window, none whose call lay outside (a call across an edge may be in either window,
  never both: the windows meet at one offset); materialized again after it closed, it holds the
  whole window. An open window says so (`window_open`).

A target retention truncated is not given windows (their data loss is the Airflow rules' concern).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dagster import TimeWindowPartitionsDefinition
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from dagster_rmqs import build_stream_asset
from dagster_rmqs.partitions import offset_range_key, offset_range_partitions
from pyspark_rmqs.committed import committed_dataset, committed_files
from tests.campaign.faults import CLOCK_SKEWS_MS, local_clock
from tests.campaign.harness import STATS, TARGETS
from tests.campaign.invariants import Violation
from tests.campaign.model import Message
from tests.campaign.produce_rules import ProduceRules
from tests.campaign.runs import Attempt

WINDOW_CONSUMER = "c5w"  # the partitioned assets' consumer name (they neither read nor store one)
WINDOW_FORMAT = "%Y-%m-%d-%H:%M"
WINDOW_KINDS = ("first", "last", "now")
MAX_WINDOWS = 4  # per sequence (a window on an idle stream costs a probe): then not drawn


class DagsterRules(ProduceRules):
    """`dagster_ranges`, `dagster_window` (see the module docstring)."""

    _materializations = itertools.count()

    @precondition(lambda self: self.config.enabled("dagster_ranges"))
    @rule(to=st.sampled_from(TARGETS), new=st.integers(5, 30), quarter=st.integers(0, 3))
    def dagster_ranges(self, to: str, new: int, quarter: int) -> None:
        """`new` messages, then offset-range keys from a quarter of each tail to the tail,
        materialized key by key."""
        if not self._step("dagster_ranges"):
            return
        if not self.model.target_exists(to):
            return self._skip("ranges-missing")
        self._publish(to, new)
        t = self.model.targets[to]
        tails = self.ops.tails(t.partitions)
        firsts = {s: self.model.partitions[s].first for s in t.partitions}
        ranges = {s: (max(firsts[s], tails[s] * quarter // 4), tails[s]) for s in t.partitions}
        ranges = {s: r for s, r in ranges.items() if r[0] < r[1]}
        if not ranges:
            return self._skip("ranges-empty")
        n = next(self._materializations)
        definition = offset_range_partitions(f"campaign_ranges_{self.uid}_{n}")
        name = f"campaign_ranges_{to}_{n}"
        output = self.tmp / name
        asset = self._asset(name, output, to, definition)
        keys = [offset_range_key(s, a, b) for s, (a, b) in ranges.items()]
        assert definition.name is not None
        self.dagster.instance.add_dynamic_partitions(definition.name, keys)
        for key in keys:
            attempt = self.dagster.materialize(asset, name, Attempt("backfill", self.model.seq), key)
            STATS[f"outcome:dagster_ranges:{attempt.label}"] += 1
            if not attempt.ok:
                raise Violation("a", f"offset-range key {key} of {t.name} failed: {attempt.describe()}")
        wanted = {
            m.body
            for s, (a, b) in ranges.items()
            for m in self.model.partitions[s].messages
            if m.offset is not None and a <= m.offset < b
        }
        got = Counter(body for body, _, _ in _rows(output))
        if set(got) != wanted or any(c > 1 for c in got.values()):
            raise Violation(
                "a",
                f"offset-range keys {keys} of {t.name} hold {sum(got.values())} rows of {len(got)} "
                f"messages, {len(wanted)} expected ({len(set(got) - wanted)} foreign, "
                f"{len(wanted - set(got))} missing, {sum(c > 1 for c in got.values())} twice)",
            )
        self._check_no_watermark(to)

    @precondition(
        lambda self: self.config.enabled("dagster_window") and self._ran("dagster_window") < MAX_WINDOWS
    )
    @rule(
        to=st.sampled_from(TARGETS),
        new=st.integers(0, 20),
        kind=st.sampled_from(WINDOW_KINDS),
        skew=st.sampled_from(CLOCK_SKEWS_MS),
    )
    def dagster_window(self, to: str, new: int, kind: str, skew: int) -> None:
        """`new` messages, then a one-minute window of target `to` (see the module docstring), its
        process's clock `skew` ms from the broker's."""
        if not self._step("dagster_window"):
            return
        if not self.model.target_exists(to):
            return self._skip("window-missing")
        if new:
            self._publish(to, new)
        t = self.model.targets[to]
        messages = [
            m for s in t.partitions for m in self.model.partitions[s].messages if m.offset is not None
        ]
        if kind != "now" and not messages:
            return self._skip("window-no-messages")
        at = {
            "first": min((m.published[0] for m in messages), default=0),
            "last": max((m.published[1] for m in messages), default=0),
            "now": int(time.time() * 1000),
        }[kind]
        start = datetime.fromtimestamp(at / 1000, UTC).replace(second=0, microsecond=0)
        key = start.strftime(WINDOW_FORMAT)
        windows = self.__dict__.setdefault("_window_assets", {})
        if to not in windows:
            n = next(self._materializations)
            name = f"campaign_windows_{to}_{n}"
            definition = TimeWindowPartitionsDefinition(
                cron_schedule="* * * * *",
                start=datetime.fromtimestamp(self.model_started_s(), UTC) - timedelta(minutes=2),
                fmt=WINDOW_FORMAT,
                end_offset=1,
            )
            output = self.tmp / name
            windows[to] = (name, self._asset(name, output, to, definition), output)
        name, asset, output = windows[to]
        STATS[f"clock_skew:{skew}"] += 1
        with local_clock(skew):
            attempt = self.dagster.materialize(asset, name, Attempt("backfill", self.model.seq), key)
        STATS[f"outcome:dagster_window:{kind}:{attempt.label}"] += 1
        s_ms, e_ms = int(start.timestamp() * 1000), int((start + timedelta(minutes=1)).timestamp() * 1000)
        gone = [
            m
            for m in messages
            if self.model.truncated(m) and m.published[1] >= s_ms and m.published[0] < e_ms
        ]
        if attempt.cause == "DataLossError":
            # Retention removed chunks whose times nobody knows now: a window starting before the
            # oldest chunk kept may have held some (docs/failure-semantics.md: a time start before
            # it is data loss). A report where no message of the window could have gone is a false
            # alarm, counted.
            kept = [m.published[0] for m in messages if not self.model.truncated(m)]
            if not gone and kept and s_ms > min(kept):
                STATS["dagster_window:data_loss_false_alarm"] += 1
            return self._check_no_watermark(to)
        if not attempt.ok:
            raise Violation("a", f"time window {key} of {t.name} failed: {attempt.describe()}")
        if gone and not attempt.data_loss:
            shown = [m.body.decode() for m in gone[:5]]
            raise Violation(
                "a",
                f"time window {key} of {t.name} succeeded without a loss report; retention removed {shown}",
            )
        messages = [m for m in messages if not self.model.truncated(m)]
        is_open = bool((attempt.summary or {}).get("window_open"))
        STATS[f"dagster_window:{'open' if is_open else 'closed'}"] += 1
        edge = start + timedelta(minutes=1)
        if not is_open and int(edge.timestamp() * 1000) > int(time.time() * 1000):
            raise Violation("a", f"time window {key} of {t.name} says closed before its end passed")
        self._check_window(t.name, key, output, start, edge, messages)
        self._check_no_watermark(to)

    # -------------------------------------------------------------------------------- helpers

    def model_started_s(self) -> float:
        """When this sequence began, by the wall clock (the windows' first partition is before it)."""
        return time.time() - (time.monotonic() - self._created)

    def _asset(self, name: str, output: Path, to: str, definition: Any) -> Any:
        """A partitioned arrow-engine asset of target `to` into `output`."""
        t = self.model.targets[to]
        where: dict[str, Any] = {"superstream": t.name} if t.superstream else {"stream": t.name}
        return build_stream_asset(
            name,
            consumer_name=WINDOW_CONSUMER,
            output_path=str(output),
            engine="arrow",
            partitions_def=definition,
            **where,
        )

    def _check_window(
        self, target: str, key: str, output: Path, start: datetime, end: datetime, messages: list[Message]
    ) -> None:
        s_ms, e_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
        got = Counter(body for body, _, _, window in _rows(output, windows=True) if window == key)
        inside = {m.body for m in messages if s_ms <= m.published[0] and m.published[1] < e_ms}
        outside = {m.body for m in messages if m.published[1] < s_ms or m.published[0] >= e_ms}
        known = {m.body for m in messages}
        problems = {
            "missing": sorted(inside - set(got)),
            "outside the window": sorted(set(got) & outside),
            "twice": sorted(b for b, c in got.items() if c > 1),
            "foreign": sorted(set(got) - known),
        }
        found = {k: v for k, v in problems.items() if v}
        if found:
            shown = {k: [b.decode() for b in v[:5]] for k, v in found.items()}
            raise Violation("a", f"time window {key} of {target} holds {sum(got.values())} rows: {shown}")

    def _check_no_watermark(self, to: str) -> None:
        parts = [x.name for x in self.model.current_parts(to)]
        stored = {s: v for s, v in self.ops.stored_on(WINDOW_CONSUMER, parts).items() if v is not None}
        if stored:
            raise Violation(
                "c", f"partitioned assets of {to} stored watermarks for {WINDOW_CONSUMER}: {stored}"
            )


def _rows(output: Path, *, windows: bool = False) -> list[Any]:
    """(body, stream, offset[, rmqs_window]) of every committed row under `output`."""
    if not output.exists() or not committed_files(str(output)):
        return []
    columns = ["value", "stream", "offset", *(["rmqs_window"] if windows else [])]
    table = committed_dataset(str(output)).to_table(columns=columns)
    cols = [table.column(c).to_pylist() for c in columns]
    cols[0] = [bytes(v) for v in cols[0]]
    return list(zip(*cols, strict=True))
