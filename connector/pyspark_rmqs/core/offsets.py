"""Pure offset arithmetic (DESIGN §6): JSON offsets, range planning, splits, merges and budgets.

Everything here is deterministic and free of Spark and network imports, so the driver-side planner,
the streaming runner and the orchestration packages share one tested implementation.

Conventions: a stream offset is an int >= 0; "next offsets" (what Spark checkpoints) are the next
offset to read per partition stream; a range is half-open ``[start, end)``; the broker-stored offset
is the last processed one (``next - 1``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark_rmqs.core.errors import ConfigurationError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetRange",
    "apply_limit",
    "merge_committed_splits",
    "offsets_from_json",
    "offsets_to_json",
    "plan_ranges",
    "proportional_budgets",
    "rows_for_bytes",
    "split_ranges",
]

LATEST = -1
"""Sentinel in offsets JSON meaning "the tail", as in Spark's Kafka source."""
EARLIEST = -2
"""Sentinel in offsets JSON meaning "the first retained offset", as in Spark's Kafka source."""

_SENTINELS = frozenset({LATEST, EARLIEST})
_LONG_MAX = 2**63 - 1  # offsets are int64 in the broker and in Spark
_EXPECTED_FORM = '{"stream-0": 42, ...} (next offset per partition stream; -1 = latest, -2 = earliest)'

K = TypeVar("K", bound=Hashable)


def _is_int(value: object) -> bool:
    """True for real ints only: JSON ``true`` parses to a bool, which is an int subclass."""
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------------
# JSON offsets


def offsets_to_json(offsets: Mapping[str, int]) -> str:
    """Serialize next offsets compactly with sorted keys, so equal offsets give byte-equal checkpoints."""
    for stream, offset in offsets.items():
        if not isinstance(stream, str) or not _is_int(offset):
            raise ConfigurationError(
                f"offsets must map stream names to integers, like {_EXPECTED_FORM}; "
                f"got {stream!r}: {offset!r}"
            )
    return json.dumps(dict(offsets), sort_keys=True, separators=(",", ":"))


class _DuplicateStream(ValueError):
    def __init__(self, stream: str, first: Any, second: Any) -> None:
        super().__init__(f"names stream {stream!r} twice ({first!r} and {second!r})")


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Refuse duplicate keys: json.loads would silently keep the last, hiding a typo."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateStream(key, result[key], value)
        result[key] = value
    return result


def offsets_from_json(
    text: str, option: str = "startingOffsets", *, earliest: bool = True, empty: bool = True
) -> dict[str, int]:
    """Parse offsets JSON from an option or a checkpoint; errors name `option` and the expected form.

    The one parser of offsets JSON (the `startingOffsets` / `endingOffsets` options, the CLI's
    `--to`, planned positions). Values are next offsets (>= 0) or the sentinels `LATEST` (-1) and,
    when `earliest`, `EARLIEST` (-2), kept as-is so the caller resolves them against the broker.
    `empty=False` refuses `{}`.
    """
    sentinels = "-1 (latest) or -2 (earliest)" if earliest else "-1 (latest)"
    allowed = _SENTINELS if earliest else frozenset({LATEST})

    def fail(reason: str) -> ConfigurationError:
        return ConfigurationError(
            f"option '{option}' {reason}; expected a JSON object of partition stream name to next offset, "
            f'like {{"stream-0": 42, ...}} (offsets >= 0, or {sentinels})'
        )

    if not isinstance(text, str):
        raise fail(f"must be a JSON string, got {type(text).__name__}")
    try:
        parsed = json.loads(text, object_pairs_hook=_reject_duplicates)
    except _DuplicateStream as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise fail(f"is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise fail("must be a JSON object")
    if not parsed and not empty:
        raise fail("must be a non-empty JSON object")
    offsets: dict[str, int] = {}
    for stream, offset in parsed.items():
        if not stream:
            raise fail("has an empty stream name")
        if not _is_int(offset):
            raise fail(f"has a non-integer offset for stream {stream!r}: {json.dumps(offset)}")
        if (offset < 0 and offset not in allowed) or offset > _LONG_MAX:
            raise fail(f"has an invalid offset {offset} for stream {stream!r}")
        offsets[stream] = offset
    return offsets


# --------------------------------------------------------------------------------------------------
# Ranges and splits


@dataclass(frozen=True)
class OffsetRange:
    """The half-open offsets ``[start, end)`` of one stream that one Spark input partition reads."""

    stream: str
    start: int
    end: int

    @property
    def size(self) -> int:
        """Number of offsets in the range; never negative, so inverted ranges count as empty."""
        return max(0, self.end - self.start)

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to read (no task should be planned for it)."""
        return self.size == 0


def plan_ranges(starts: Mapping[str, int], ends: Mapping[str, int]) -> list[OffsetRange]:
    """One range per stream known on both sides, sorted by name; empty ranges are dropped (no empty tasks)."""
    streams = sorted(starts.keys() & ends.keys())
    ranges = (OffsetRange(stream, starts[stream], ends[stream]) for stream in streams)
    return [r for r in ranges if not r.is_empty]


def _split_one(rng: OffsetRange, parts: int) -> list[OffsetRange]:
    """Cut a range into `parts` contiguous pieces whose sizes differ by at most 1 (larger ones first)."""
    size = rng.size
    parts = max(1, min(parts, size))
    quotient, remainder = divmod(size, parts)
    pieces: list[OffsetRange] = []
    start = rng.start
    for index in range(parts):
        end = start + quotient + (1 if index < remainder else 0)
        pieces.append(OffsetRange(rng.stream, start, end))
        start = end
    return pieces


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges so there are at least `min_partitions` tasks, as Spark Kafka's `minPartitions`.

    Nothing changes when `min_partitions` is None or already met by the non-empty ranges: splitting
    costs a consumer (connection, discarded chunk tails) per split. Otherwise each non-empty range
    gets a number of splits proportional to its size (`proportional_budgets` over the range sizes),
    at least 1 and at most its size, so the total equals `min_partitions` whenever the total size
    allows it. Empty ranges are dropped; the result is sorted by stream then start.
    """
    if min_partitions is None:
        return list(ranges)
    if not _is_int(min_partitions) or min_partitions < 1:
        raise ConfigurationError(f"minPartitions must be a positive integer, got {min_partitions!r}")
    non_empty = [r for r in ranges if not r.is_empty]
    if min_partitions <= len(non_empty):
        return list(ranges)
    keyed = {(r.stream, r.start, r.end): r for r in non_empty}
    parts = _largest_remainder({key: r.size for key, r in keyed.items()}, min_partitions)
    splits = [piece for key, r in keyed.items() for piece in _split_one(r, parts[key])]
    return sorted(splits, key=lambda r: (r.stream, r.start, r.end))


# --------------------------------------------------------------------------------------------------
# Budgets (admission control)


def _largest_remainder(pending: Mapping[K, int], total: int) -> dict[K, int]:
    """`proportional_budgets` over any sortable keys (split planning keys by range, not by stream)."""
    budgets: dict[K, int] = {key: 0 for key in pending}
    active = {key: count for key, count in pending.items() if count > 0}
    pending_sum = sum(active.values())
    if total >= pending_sum:
        budgets.update(active)
        return budgets
    # Exact integer shares: total * count / pending_sum = floor + remainder / pending_sum.
    order = sorted(active, key=lambda k: (-((total * active[k]) % pending_sum), k))
    for key, count in active.items():
        budgets[key] = (total * count) // pending_sum
    leftover = total - sum(budgets.values())
    for key in order[:leftover]:
        budgets[key] += 1  # floor < count because total < pending_sum, so this stays <= count
    # At least 1 per non-empty partition, so no partition starves; then give the extra back from the
    # largest budgets (ties by key) to keep the sum at `total` whenever total >= len(active).
    excess = 0
    for key in active:
        if budgets[key] == 0:
            budgets[key] = 1
            excess += 1
    while excess:
        donor = min(
            (k for k in active if budgets[k] > 1),
            key=lambda k: (-budgets[k], k),
            default=None,
        )
        if donor is None:
            break
        budgets[donor] -= 1
        excess -= 1
    return budgets


def proportional_budgets(pending: Mapping[str, int], total: int) -> dict[str, int]:
    """Share `total` records among partitions in proportion to their pending counts (DESIGN §6).

    Floor shares first, then the leftover goes one each to the largest fractional remainders (ties
    by stream name, so planning is deterministic). Every partition with pending data gets at least 1,
    so a small partition never starves behind a big one; to honour that, units are taken back from
    the largest budgets, and only when ``total`` is smaller than the number of non-empty partitions
    does the sum exceed ``total``. No partition gets more than its pending; if ``total`` covers all
    pending, each gets exactly its pending. Partitions with nothing pending get 0.
    """
    if not _is_int(total) or total < 0:
        raise ConfigurationError(f"record budget must be an integer >= 0, got {total!r}")
    for stream, count in pending.items():
        if not _is_int(count) or count < 0:
            raise ConfigurationError(f"pending count of stream {stream!r} must be an int >= 0, got {count!r}")
    return _largest_remainder(pending, total)


def apply_limit(
    starts: Mapping[str, int], tails: Mapping[str, int], max_records: int | None
) -> dict[str, int]:
    """End offsets of one micro-batch under `maxRecordsPerTrigger`-style admission control.

    Every stream in `starts` gets an end; streams only in `tails` are ignored (they have no start
    yet), and streams without a tail stay at their start. Ends never go below starts (a tail can look
    stale) and never beyond tails.
    """
    if max_records is not None and (not _is_int(max_records) or max_records < 1):
        raise ConfigurationError(f"maxRecordsPerTrigger must be a positive integer, got {max_records!r}")
    for stream, start in starts.items():
        if not _is_int(start) or start < 0:
            raise ConfigurationError(f"start offset of stream {stream!r} must be an int >= 0, got {start!r}")
    pending = {stream: max(0, tails[stream] - start) for stream, start in starts.items() if stream in tails}
    budgets = pending if max_records is None else proportional_budgets(pending, max_records)
    return {stream: start + budgets.get(stream, 0) for stream, start in starts.items()}


def rows_for_bytes(max_bytes: int, avg_message_size: float) -> int:
    """Turn a `maxBytesPerTrigger` budget into a row budget; at least 1 row so a batch always progresses."""
    if not _is_int(max_bytes) or max_bytes < 1:
        raise ConfigurationError(f"maxBytesPerTrigger must be a positive integer, got {max_bytes!r}")
    average = avg_message_size if math.isfinite(avg_message_size) else 1.0
    return max(1, math.floor(max_bytes / max(1.0, average)))


# --------------------------------------------------------------------------------------------------
# Split commits


def merge_committed_splits(base: int, splits: Sequence[tuple[int, int, int]]) -> int:
    """Merge the results of one stream's splits into its next offset, as SPEC "Split offset merge" says.

    `base` is the stream's current next offset; each split result is ``(start, end, committed)``
    with ``start <= committed <= end``, ``committed == end`` when the split finished. The algorithm,
    step by step: dedupe by ``(start, end)`` keeping the max `committed` per range (retries); sort by
    `start` (then `end`); walk the splits in that order and advance while ``start == base`` and
    ``committed == end``, setting ``base = end``; stop at the first split that fails the test.

    So a partially committed split does not advance the checkpoint at all (its committed part is
    read again by the retry of the range: duplicates, never a gap), a missing split (a gap) stops the
    merge, and a split that does not start exactly at the position (one before `base`, or overlapping
    another) stops it too: pass the splits of the range starting at `base`. Example from SPEC: base 0,
    [0,100) committed, [100,200) failed, [200,300) committed: the result is 100.
    """
    if not _is_int(base) or base < 0:
        raise ConfigurationError(f"base offset must be an integer >= 0, got {base!r}")
    best: dict[tuple[int, int], int] = {}
    for start, end, committed in splits:
        if not (_is_int(start) and _is_int(end) and _is_int(committed)) or start > end:
            raise ConfigurationError(f"split range [{start}, {end}) is not a range of integer offsets")
        if not start <= committed <= end:
            raise ConfigurationError(
                f"split [{start}, {end}) reports committed offset {committed}, outside [{start}, {end}]"
            )
        best[(start, end)] = max(best.get((start, end), committed), committed)
    for (start, end), committed in sorted(best.items()):
        if start != base or committed != end:
            break
        base = end
    return base
