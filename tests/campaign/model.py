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

Where retention removed a consumer's newest run record from `rmqs.runs` (`evicted`), its next run
plans from its stored offsets, elsewhere from `starting_offsets`, as a consumer that never ran: a
`latest` consumer owes nothing published before that run planned on a partition with no stored
offset (`part_boundaries`); no loss report is owed for what retention took below a watermark the
broker forgot.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
    # Local clock (epoch ms) just before the publish call and just after its confirms: the broker
    # timestamps each chunk when it writes it, on this machine's clock, so the message's chunk
    # timestamp lies within (stamps are per chunk: every message of one call shares the window).
    published: tuple[int, int] = (0, 0)


@dataclass
class Partition:
    """A partition stream (a plain stream is its own only partition) in its current incarnation."""

    name: str
    incarnation: int = 0
    exists: bool = True
    messages: list[Message] = field(default_factory=list)
    first: int = 0  # the first offset retention kept (the truncate rule moves it)

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
    # Partition streams once bound and since deleted and left so (`drop_partition`): outputs may
    # hold what runs read from them before.
    dropped: set[str] = field(default_factory=set)


@dataclass
class PipelineModel:
    """One consumer name reading one target into one output (a list or a Parquet folder)."""

    key: str
    consumer: str
    target: str
    sink: str  # "fn": at-least-once function sink; "parquet" / "iceberg": an exactly-once folder / table
    starting: str  # "earliest" | "latest"
    engine: str = "airflow"  # "airflow": the consume operator; "dagster": an arrow-engine asset;
    # "spark": the Airflow Spark read operator; "dagster-spark": a Spark-engine asset
    boundary: int | None = None  # seq when its first watermark run planned (latest only matters)
    boundary_parts: frozenset[Part] = frozenset()
    pending_since: int | None = None  # seq at the first failed try since its last success
    excused: set[bytes] = field(default_factory=set)  # reported lost or legitimately skipped
    promised: set[bytes] = field(default_factory=set)  # a successful run said these are delivered
    watermarks: dict[Part, int] = field(default_factory=dict)  # highest stored offset observed
    # A storing run of this consumer on this target got past planning (wrote a run record): from
    # then on its plans start below a stream's first offset on a stream new to it too (offset 0),
    # so retention truncating what it has not read is a loss its next run must report.
    planned_ever: bool = False
    # Messages retention removed before this consumer read them, not reported yet (still owed: a run
    # that passes over them without a report is a silent loss); excused once a run reports them.
    lost: set[bytes] = field(default_factory=set)
    # Whether `rmqs.runs` holds a record of it (written by a storing run that planned, or by
    # `rmqs watermark set`; observed on the broker where retention can remove records).
    has_record: bool = False
    # Retention removed its newest record and no storing run planned since: its next run plans from
    # its stored offsets, elsewhere from `starting`, as a consumer that never ran (docs/permissions.md).
    evicted: bool = False
    # A latest consumer's boundary per partition incarnation where a run planned it from `latest`
    # again (no stored offset, no record): nothing published there before it is owed.
    part_boundaries: dict[Part, int] = field(default_factory=dict)

    @property
    def exactly_once(self) -> bool:
        return self.sink in ("parquet", "iceberg")


class Model:
    """Every target, partition incarnation, message and pipeline of one campaign sequence."""

    def __init__(self) -> None:
        self.seq = 0
        self.partitions: dict[str, Partition] = {}
        self.targets: dict[str, TargetModel] = {}
        self.messages: dict[bytes, Message] = {}
        self.pipelines: dict[str, PipelineModel] = {}
        self.windows: list[tuple[int, int]] = []  # every publish call's clock window, in order

    # ----------------------------------------------------------------------------- topology

    def add_target(self, key: str, name: str, partitions: Sequence[str], *, superstream: bool) -> None:
        self.targets[key] = TargetModel(key, name, superstream, list(partitions))
        for p in partitions:
            self.partitions[p] = Partition(p)

    def add_partition(self, target: str, stream: str) -> None:
        """A partition bound to a super stream after the fact (routing now spreads over one more); a
        stream of that name deleted before is a new incarnation."""
        self.targets[target].partitions.append(stream)
        if stream in self.partitions:
            self.create(stream)
        else:
            self.partitions[stream] = Partition(stream)

    def drop_partition(self, target: str, stream: str) -> None:
        """A partition stream deleted and left so: its binding went with it (routing spreads over one
        fewer), and its messages are gone, owed to nobody."""
        self.targets[target].partitions.remove(stream)
        self.targets[target].dropped.add(stream)
        self.delete(stream)

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
        part.first = 0

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

    def record(
        self,
        stream: str,
        items: Sequence[tuple[int, bytes]],
        offsets: Sequence[int | None],
        published: tuple[int, int] = (0, 0),
    ) -> None:
        """`items` were published to `stream`, in order, at `offsets` (None: not known), by a publish
        call within the clock window `published` (epoch ms)."""
        part = self.partitions[stream]
        for (seq, body), offset in zip(items, offsets, strict=True):
            m = Message(seq, body, stream, part.incarnation, offset, published)
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
            at = (m.stream, m.incarnation)
            if at in p.boundary_parts and m.seq < p.boundary:
                return False
            if m.seq < p.part_boundaries.get(at, -1):
                return False
            if p.evicted and at not in p.watermarks:
                return False  # its next run plans this partition from its tail: nothing there is owed
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

    # ---------------------------------------------------------------------------- retention

    def truncated(self, m: Message) -> bool:
        """Whether retention removed `m` (current incarnation, below the first offset kept)."""
        part = self.partitions[m.stream]
        return part.incarnation == m.incarnation and m.offset is not None and m.offset < part.first

    def truncate(self, stream: str, first: int) -> list[Message]:
        """Retention moved `stream`'s first offset to `first`: the messages it newly removed."""
        part = self.partitions[stream]
        gone = [m for m in part.messages if m.offset is not None and part.first <= m.offset < first]
        part.first = max(part.first, first)
        return gone

    def named(self, spans: Mapping[str, Sequence[int]]) -> list[Message]:
        """The messages retention really removed within offsets `[start, end)` of these streams."""
        out: list[Message] = []
        for stream, span in spans.items():
            if stream not in self.partitions or len(span) != 2:
                continue
            start, end = int(span[0]), int(span[1])
            out.extend(
                m
                for m in self.partitions[stream].messages
                if self.truncated(m) and m.offset is not None and start <= m.offset < end
            )
        return out

    def excuse_reported(self, p: PipelineModel, spans: Mapping[str, Sequence[int]]) -> list[Message]:
        """A run of `p` reported offsets `[start, end)` of these streams lost: the messages there that
        retention really removed are no longer owed (what is still readable stays owed)."""
        out = self.named(spans)
        self.excuse(p, out)
        p.lost.difference_update(m.body for m in out)
        return out

    # ------------------------------------------------------------------------------ time

    def gaps(self, now_ms: int) -> list[int]:
        """Times (epoch ms, in the past) no publish call's window holds: a time position there
        splits every partition's messages exactly into those published before and after it,
        whichever chunk each landed in."""
        out: list[int] = []
        edges = [(0, 0), *self.windows, (now_ms, now_ms)]
        for (_, before), (after, _) in itertools.pairwise(edges):
            if after - before >= 4:
                out.append((before + after) // 2 if before else after - 1000)
        return [t for t in out if 0 < t < now_ms]

    def published_between(self, stream: str, start: int, end: int | None) -> list[Message]:
        """Messages of `stream`'s current incarnation published at or after `start` and before `end`
        (epoch ms; None: no end), retention's removals included."""
        return [
            m
            for m in self.partitions[stream].messages
            if m.published[0] >= start and (end is None or m.published[1] < end)
        ]
