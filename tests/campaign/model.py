"""The reference model: what was published where, and what each consumer's output must hold.

Pure bookkeeping, no broker. Every message has a unique body (`m:<seq>`), so it is recognised in
any output across stream incarnations; `seq` orders every publish of the campaign, which is how
"published before this run started" is decided. A partition stream deleted and created again gets
a new incarnation: its old messages are gone from the broker, so no output is expected to hold
the ones it had not read.

What a consumer must hold ("where it started"):
- `starting_offsets="earliest"`: every message of every partition incarnation it can still read;
- `starting_offsets="latest"`: nothing published before its first run planned (`boundary`) in the
  partition incarnations that existed then (`boundary_parts`); everything of a partition bound to
  the super stream later and of a stream re-created later (those are read from their start);
- minus what a run reported lost (`excused`) or legitimately skipped (an explicit storing start).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

Part = tuple[str, int]  # (partition stream, incarnation)


@dataclass(frozen=True)
class Message:
    """One published message: where it went and, when the broker's tails showed it, its offset."""

    seq: int
    body: bytes
    stream: str
    incarnation: int
    offset: int | None


@dataclass
class Partition:
    """A partition stream (a plain stream is its own only partition) in its current incarnation."""

    name: str
    incarnation: int = 0
    exists: bool = True
    messages: list[Message] = field(default_factory=list)

    @property
    def part(self) -> Part:
        return (self.name, self.incarnation)


@dataclass
class TargetModel:
    """A stream or super stream as the runs name it; `partitions` in the broker's routing order."""

    key: str
    name: str
    superstream: bool
    partitions: list[str]


@dataclass
class PipelineModel:
    """One consumer name reading one target into one output (a list or a Parquet folder)."""

    key: str
    consumer: str
    target: str
    sink: str  # "fn": at-least-once function sink; "parquet": exactly-once Parquet folder
    starting: str  # "earliest" | "latest"
    engine: str = "airflow"  # "airflow": the consume operator; "dagster": an arrow-engine asset
    boundary: int | None = None  # seq when its first watermark run planned (latest only matters)
    boundary_parts: frozenset[Part] = frozenset()
    pending_since: int | None = None  # seq at the first failed try since its last success
    excused: set[bytes] = field(default_factory=set)  # reported lost or legitimately skipped
    promised: set[bytes] = field(default_factory=set)  # a successful run said these are delivered
    watermarks: dict[Part, int] = field(default_factory=dict)  # highest stored offset observed

    @property
    def exactly_once(self) -> bool:
        return self.sink == "parquet"


class Model:
    """Every target, partition incarnation, message and pipeline of one campaign sequence."""

    def __init__(self) -> None:
        self.seq = 0
        self.partitions: dict[str, Partition] = {}
        self.targets: dict[str, TargetModel] = {}
        self.messages: dict[bytes, Message] = {}
        self.pipelines: dict[str, PipelineModel] = {}

    # ----------------------------------------------------------------------------- topology

    def add_target(self, key: str, name: str, partitions: Sequence[str], *, superstream: bool) -> None:
        self.targets[key] = TargetModel(key, name, superstream, list(partitions))
        for p in partitions:
            self.partitions[p] = Partition(p)

    def add_partition(self, target: str, stream: str) -> None:
        """A partition bound to a super stream after the fact (routing now spreads over one more)."""
        self.targets[target].partitions.append(stream)
        self.partitions[stream] = Partition(stream)

    def delete(self, stream: str) -> None:
        part = self.partitions[stream]
        part.exists = False
        part.messages = []

    def create(self, stream: str) -> None:
        """The stream exists again, as a new incarnation: none of the old messages are in it."""
        part = self.partitions[stream]
        part.incarnation += 1
        part.exists = True
        part.messages = []

    def target_exists(self, key: str) -> bool:
        return all(self.partitions[p].exists for p in self.targets[key].partitions)

    def current_parts(self, key: str) -> list[Partition]:
        return [self.partitions[p] for p in self.targets[key].partitions if self.partitions[p].exists]

    def part_of(self, stream: str) -> Part:
        return self.partitions[stream].part

    # ----------------------------------------------------------------------------- messages

    def next_bodies(self, n: int) -> list[tuple[int, bytes]]:
        out = [(self.seq + i, f"m:{self.seq + i}".encode()) for i in range(n)]
        self.seq += n
        return out

    def record(self, stream: str, items: Sequence[tuple[int, bytes]], offsets: Sequence[int | None]) -> None:
        """`items` were published to `stream`, in order, at `offsets` (None: not known)."""
        part = self.partitions[stream]
        for (seq, body), offset in zip(items, offsets, strict=True):
            m = Message(seq, body, stream, part.incarnation, offset)
            part.messages.append(m)
            self.messages[body] = m

    # ---------------------------------------------------------------------------- consumers

    def pipelines_of(self, target: str) -> Iterator[PipelineModel]:
        return (p for p in self.pipelines.values() if p.target == target)

    def start_boundary(self, p: PipelineModel, seq: int) -> None:
        """A latest consumer's first run planned at `seq`: what was there before is not for it."""
        if p.boundary is None:
            p.boundary = seq
            p.boundary_parts = frozenset(part.part for part in self.current_parts(p.target))

    def owed(self, p: PipelineModel, m: Message) -> bool:
        """Whether `p` must eventually hold `m` (it is still readable: current incarnation)."""
        part = self.partitions[m.stream]
        if not part.exists or part.incarnation != m.incarnation or m.body in p.excused:
            return False
        if p.starting == "latest":
            if p.boundary is None:
                return False
            if (m.stream, m.incarnation) in p.boundary_parts and m.seq < p.boundary:
                return False
        return True

    def expected(self, p: PipelineModel, horizon: int | None = None) -> list[Message]:
        """Messages `p` must hold once a run planned at `horizon` (seq; None: now) succeeded."""
        out: list[Message] = []
        for part in self.current_parts(p.target):
            out.extend(m for m in part.messages if (horizon is None or m.seq < horizon) and self.owed(p, m))
        return out

    def excuse(self, p: PipelineModel, messages: Iterable[Message]) -> None:
        p.excused.update(m.body for m in messages)

    def owed_at_or_below(self, p: PipelineModel, stream: str, watermark: int) -> list[Message]:
        """Messages of `stream`'s current incarnation at offsets up to `watermark` that `p` owes."""
        part = self.partitions[stream]
        return [
            m for m in part.messages if m.offset is not None and m.offset <= watermark and self.owed(p, m)
        ]
