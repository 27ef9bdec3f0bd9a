"""Filter pushdown: comparisons on `offset` and `chunk_timestamp`, equality on `stream`.

Filters on `offset` and `stream` are applied exactly by narrowing the planned ranges, so they are
accepted. Filters on `chunk_timestamp` narrow the ranges to the chunks that can match (the broker
locates chunks by timestamp) but are handed back to Spark, which checks every row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


@dataclass
class Pushed:
    """What the accepted filters ask for: an offset window, stream names, a timestamp window (ms)."""

    offset_min: int | None = None  # inclusive
    offset_max: int | None = None  # exclusive
    streams: set[str] | None = None
    ts_min_ms: int | None = None  # inclusive, chunk timestamp in epoch millis
    ts_max_ms: int | None = None  # exclusive
    accepted: list[str] = field(default_factory=list)

    def narrow_offsets(self, lo: int | None, hi: int | None) -> None:
        if lo is not None:
            self.offset_min = lo if self.offset_min is None else max(self.offset_min, lo)
        if hi is not None:
            self.offset_max = hi if self.offset_max is None else min(self.offset_max, hi)

    def narrow_ts(self, lo: int | None, hi: int | None) -> None:
        if lo is not None:
            self.ts_min_ms = lo if self.ts_min_ms is None else max(self.ts_min_ms, lo)
        if hi is not None:
            self.ts_max_ms = hi if self.ts_max_ms is None else min(self.ts_max_ms, hi)

    def keep_streams(self, names: Iterable[str]) -> None:
        wanted = set(names)
        self.streams = wanted if self.streams is None else self.streams & wanted


def _micros(v: Any) -> int | None:
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return int(v.timestamp() * 1_000_000)
    return None


def push(filters: list[Filter], pushed: Pushed) -> Iterable[Filter]:
    """Record what can be pushed in `pushed`; yield the filters Spark must still evaluate."""
    for f in filters:
        col = f.attribute if isinstance(f.attribute, tuple) else (f.attribute,)  # type: ignore[attr-defined]
        name = col[0] if len(col) == 1 else None
        if name == "offset" and isinstance(f, _COMPARISONS) and _is_int(f.value):
            v = int(f.value)
            if isinstance(f, EqualTo):
                pushed.narrow_offsets(v, v + 1)
            elif isinstance(f, GreaterThan):
                pushed.narrow_offsets(v + 1, None)
            elif isinstance(f, GreaterThanOrEqual):
                pushed.narrow_offsets(v, None)
            elif isinstance(f, LessThan):
                pushed.narrow_offsets(None, v)
            else:
                pushed.narrow_offsets(None, v + 1)
            pushed.accepted.append(repr(f))
            continue
        if name == "stream" and isinstance(f, EqualTo) and isinstance(f.value, str):
            pushed.keep_streams([f.value])
            pushed.accepted.append(repr(f))
            continue
        if name == "stream" and isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            pushed.keep_streams(f.value)
            pushed.accepted.append(repr(f))
            continue
        if name == "chunk_timestamp" and isinstance(f, _COMPARISONS):
            us = _micros(f.value)
            if us is not None:
                ms, rem = divmod(us, 1000)
                # chunk timestamps are whole millis: ts_us >= us  <=>  ts_ms >= ceil(us / 1000)
                ceil_ms = ms + (1 if rem else 0)
                if isinstance(f, EqualTo):
                    pushed.narrow_ts(ceil_ms, ms + 1)
                elif isinstance(f, GreaterThan):
                    pushed.narrow_ts(ms + 1, None)
                elif isinstance(f, GreaterThanOrEqual):
                    pushed.narrow_ts(ceil_ms, None)
                elif isinstance(f, LessThan):
                    pushed.narrow_ts(None, ceil_ms)
                else:
                    pushed.narrow_ts(None, ms + 1)
        yield f  # evaluated by Spark (chunk_timestamp only narrows)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def apply(
    starts: Mapping[str, int], ends: Mapping[str, int], pushed: Pushed, ts_offset: Any
) -> tuple[dict[str, int], dict[str, int]]:
    """Narrow per-stream [start, end) by the pushed filters; `ts_offset(stream, ms)` locates chunks."""
    s2: dict[str, int] = {}
    e2: dict[str, int] = {}
    for s in starts:
        if pushed.streams is not None and s not in pushed.streams:
            continue
        lo, hi = starts[s], ends[s]
        if pushed.offset_min is not None:
            lo = max(lo, pushed.offset_min)
        if pushed.offset_max is not None:
            hi = min(hi, pushed.offset_max)
        if lo < hi and pushed.ts_min_ms is not None:
            lo = max(lo, ts_offset(s, pushed.ts_min_ms))
        if lo < hi and pushed.ts_max_ms is not None:
            hi = min(hi, ts_offset(s, pushed.ts_max_ms))
        s2[s], e2[s] = lo, max(lo, hi)
    return s2, e2
