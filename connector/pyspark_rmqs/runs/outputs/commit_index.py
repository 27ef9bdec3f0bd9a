"""A compacted index of an output's commit records, so that a run and a reader touch O(1) of them.

Every exactly-once run writes one commit record (`_rmqs_commits/<token>.json`, `delivery.py`): the
manifest of its files, and the proof a retry of its range finds. A run also needs what *earlier*
runs of its consumer committed (`committed_spans`: a watermark put back must not write a range
twice), and a reader needs every committed file (`committed.py`). Reading or even listing every
record costs a round trip (or a listed key) per earlier run, linear in the history.

So, as Spark's file sink log compacts every N batches: once `COMPACT_EVERY` records sit in the
folder, a run folds them into an index object `_rmqs_commits/_index/<id>.json` (the committed
offset spans merged per consumer, stream and stream incarnation, then the files), and then moves
the records it folded into `_rmqs_commits/_archive/`, out of the listed prefix. A run or a reader
lists the folder (fewer than `COMPACT_EVERY` names), lists `_index/` (one object, a few while
compactions race) and reads those; a run parses only the index's first line (the spans).

Crash safety, the order of a compaction (`compact`):

1. read every index object and every listed record (a record listed but gone was archived by a
   concurrent compaction meanwhile: it is read from the archive);
2. write their union as a new index object, whole or not at all (a rename, or one object PUT);
3. delete the index objects it read (the new one holds everything they held);
4. move the records it folded into `_archive/` (a rename; copy then delete on an object store).

So a token is always in a listed record or in an index object present, and a reader unions every
index object it lists (an object deleted between its listing and its read is subsumed by a newer
one: it lists again). A kill anywhere leaves a record both listed and indexed, or two index
objects, which the union reads as one. Two runs compacting at once each write their own object and
delete only what they read, so neither hides the other's records. Nothing is ever overwritten.

The records stay the source of truth: `_archive/` and the listed records hold every commit (with
`_archive/_expired-<id>.json`, what `expire` folded, see below). Where no index object is present or
one cannot be parsed (deleted or damaged by hand), a read lists the archive and reads it whole
(O(history), once: the next compaction writes a complete index again). Deleting `_index/` is safe.

A late retry of an archived run finds its record in `_archive/` (`delivery`'s `record`). Retention
(`expire`, the `rmqs commits expire` command): archived records older than a cutoff are folded
into one `_expired-<id>.json` snapshot in the archive (spans and files, written before the records
are deleted) and deleted. The index keeps their spans and files, so readers still list their files
and a late retry of an expired run, whose record is gone, finds its whole range committed
(`committed_spans`) and writes nothing again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark_rmqs.runs.incarnation import UNMARKED
from pyspark_rmqs.runs.incarnation import same as same_incarnation

INDEX_DIR = "_index"
ARCHIVE_DIR = "_archive"
EXPIRED = "_expired-"  # an `expire` snapshot's name in the archive
COMPACT_EVERY = 16  # records in the listed folder before a run folds them in
VERSION = 2
_NO_CONSUMER = "\u0000"  # a record without a consumer name (an index key must be a string)
_RELISTS = 5  # an index object gone between listing and read: list again (then read the archive)

Spans = dict[str, dict[str, dict[str, list[list[int]]]]]  # consumer -> stream -> incarnation -> spans


class RecordFolder(Protocol):
    """A `_rmqs_commits` folder (local or object store), addressed by `/`-separated relative names."""

    remote: bool  # a round trip per object: reads go in parallel

    def list_names(self, sub: str = "") -> list[str]:
        """The file names directly in `sub` (the folder itself by default; [] when absent)."""
        ...

    def read_bytes(self, name: str) -> bytes | None:
        """The object `name` (None when absent)."""
        ...

    def write_bytes(self, name: str, body: bytes) -> None:
        """`name` whole or not at all."""
        ...

    def delete(self, name: str) -> None:
        """Remove `name` (absent is fine)."""
        ...

    def move(self, name: str, to: str) -> None:
        """`name` to `to`, never absent from both (a rename; copy then delete on an object store)."""
        ...


def record_names(folder: RecordFolder) -> list[str]:
    """The listed records (`<token>.json`), leaving out `_` names and temporary files."""
    return [n for n in folder.list_names() if n.endswith(".json") and not n.startswith(("_", "."))]


def read_record(folder: RecordFolder, name: str) -> dict[str, Any] | None:
    """The record `name` where it is: listed, or archived since (None when neither holds it)."""
    for where in (name, f"{ARCHIVE_DIR}/{name}"):
        found = _json(folder.read_bytes(where))
        if found is not None:
            return found
    return None


@dataclass
class Snapshot:
    """Every commit of a folder, as its index objects and the records outside them say."""

    runs: int = 0  # records folded in (one folded twice after an interrupted compaction counts twice)
    spans: Spans = field(default_factory=dict)
    unindexed: int = 0  # records read raw (listed records, or the archive when no index answered)
    listed: list[str] = field(default_factory=list)  # the listed record names (compaction folds these)
    _files: dict[str, None] = field(default_factory=dict)
    _unparsed: list[bytes] = field(default_factory=list)  # index objects' file lists, parsed on demand

    @property
    def files(self) -> list[str]:
        """Every committed file, each once (a run never asks: only readers parse the file lists)."""
        for chunk in self._unparsed:  # written by `to_bytes`: a list of strings
            self._files.update(dict.fromkeys(json.loads(chunk)))
        self._unparsed.clear()
        return list(self._files)

    def add(self, record: Mapping[str, Any]) -> None:
        """Fold one record in."""
        self.runs += 1
        self._files.update(dict.fromkeys(str(f) for f in record.get("files", [])))
        consumer = record.get("consumer")
        ranges = {s: [int(r[0]), int(r[1])] for s, r in (record.get("ranges") or {}).items()}
        incarnations = record.get("incarnations") or {}
        key = _NO_CONSUMER if consumer is None else str(consumer)
        self._add_spans(
            {key: {s: {str(int(incarnations.get(s) or UNMARKED)): [r]} for s, r in ranges.items()}}
        )

    def merge(self, other: Snapshot) -> None:
        """Fold another snapshot in (an index object, an expired snapshot)."""
        self.runs += other.runs
        self._add_spans(other.spans)
        self._files.update(other._files)
        self._unparsed += other._unparsed

    def _add_spans(self, spans: Spans) -> None:
        for consumer, streams in spans.items():
            by_stream = self.spans.setdefault(consumer, {})
            for stream, incs in streams.items():
                mine = by_stream.setdefault(stream, {})
                for key, found in incs.items():
                    merged = _merge([*mine.get(key, []), *(s for s in found if s[0] < s[1])])
                    if merged:  # merged: a history of runs is one span
                        mine[key] = merged

    def to_bytes(self) -> bytes:
        """Two lines: the spans (all a run parses), then the files (what a reader parses)."""
        head = {"version": VERSION, "runs": self.runs, "spans": self.spans}
        return b"%s\n%s\n" % (_dumps(head), _dumps(self.files))

    @classmethod
    def parse(cls, body: bytes) -> Snapshot | None:
        """An index object (or an expired snapshot); None when it is not one (damaged)."""
        head_line, _, rest = body.partition(b"\n")
        try:
            head = json.loads(head_line)
        except ValueError:
            return None
        if not isinstance(head, dict):
            return None
        if head.get("version") == 1:  # an index of the first format: one object, `index.json`
            files = dict.fromkeys(str(f) for f in head.get("files", []))
            return cls(len(head.get("tokens", [])), head.get("spans", {}), _files=files)
        if head.get("version") != VERSION or not rest.strip():
            return None
        return cls(int(head.get("runs", 0)), head.get("spans", {}), _unparsed=[rest])

    def spans_of(
        self, consumer: str | None, ranges: Mapping[str, tuple[int, int]], incarnations: Mapping[str, int]
    ) -> dict[str, list[tuple[int, int]]]:
        """Per stream, the merged spans of `ranges` that `consumer`'s commits on the same stream
        incarnation hold (`incarnation.same`: a record of an unmarked stream counts as the same)."""
        by_stream = self.spans.get(_NO_CONSUMER if consumer is None else consumer, {})
        out: dict[str, list[tuple[int, int]]] = {}
        for stream, (lo, hi) in ranges.items():
            ours = int(incarnations.get(stream) or UNMARKED)
            found = []
            for key, spans in by_stream.get(stream, {}).items():
                if not same_incarnation(int(key), ours):
                    continue
                for a, b in spans:
                    x, y = max(lo, a), min(hi, b)
                    if x < y:
                        found.append([x, y])
            if found:
                out[stream] = [(a, b) for a, b in _merge(found)]
        return out


def snapshot(folder: RecordFolder) -> Snapshot:
    """The folder's commits: the index objects, plus every listed record (read raw)."""
    return _snapshot(folder)[0]


def _snapshot(folder: RecordFolder) -> tuple[Snapshot, list[str], list[str]]:
    """The snapshot, the index objects it read and the listed records it folded in.

    The records are listed before the index: a record archived after that listing was indexed
    before its move, so an index object listed later holds it."""
    listed = record_names(folder)
    snap, indexes = _indexes(folder)
    if snap is None:  # no index object, or a damaged one: the archive answers
        snap = _archive(folder)
    snap.listed = listed
    folded = []
    for name, record in zip(listed, _read_all(folder, listed, read_record), strict=True):
        if record is not None:
            snap.add(record)
            snap.unindexed += 1
            folded.append(name)
    return snap, indexes, folded


def _indexes(folder: RecordFolder) -> tuple[Snapshot | None, list[str]]:
    """The union of the index objects (None when there is none, or one is damaged) and their names."""
    names: list[str] = []
    for _ in range(_RELISTS):
        names = [f"{INDEX_DIR}/{n}" for n in folder.list_names(INDEX_DIR) if n.endswith(".json")]
        if not names:
            return None, []
        bodies = _read_all(folder, names, lambda f, n: f.read_bytes(n))
        if any(b is None for b in bodies):
            continue  # deleted since the listing: a newer object holds what it held
        snap = Snapshot()
        for body in bodies:
            part = Snapshot.parse(body or b"")
            if part is None:
                return None, names
            snap.merge(part)
        return snap, names
    return None, names


def _archive(folder: RecordFolder) -> Snapshot:
    """Every archived record and expired snapshot, read raw: the repair when no index answers."""
    names = [n for n in folder.list_names(ARCHIVE_DIR) if n.endswith(".json")]
    snap = Snapshot()
    for name, body in zip(names, _read_all(folder, [f"{ARCHIVE_DIR}/{n}" for n in names], _raw), strict=True):
        if name.startswith(EXPIRED):
            part = Snapshot.parse(body or b"")
            if part is not None:
                snap.merge(part)
        elif (record := _json(body)) is not None:
            snap.add(record)
            snap.unindexed += 1
    return snap


def compact(folder: RecordFolder, *, every: int | None = None, listed: int | None = None) -> bool:
    """Fold the listed records into a new index object once there are `every` (`COMPACT_EVERY`,
    read at the call: the campaign lowers it) of them, then archive them; True when it did.

    `listed`: how many records the run saw listed before its own commit (its `committed_spans`):
    below the threshold, no I/O at all, the common case after a run."""
    every = COMPACT_EVERY if every is None else every
    if listed is not None and listed + 1 < every:
        return False
    if listed is None and len(record_names(folder)) < every:
        return False
    snap, indexes, folded = _snapshot(folder)
    if len(snap.listed) < every:
        return False
    name = f"{INDEX_DIR}/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    folder.write_bytes(name, snap.to_bytes())  # 2. whole or not at all
    for old in indexes:  # 3. every object read is held by the new one
        folder.delete(old)
    # 4. out of the listed prefix, only now that an index holds it (in parallel where remote: the
    # moves are independent, each leaves its record in one place or both)
    _read_all(folder, folded, lambda f, n: f.move(n, f"{ARCHIVE_DIR}/{n}"))
    return True


@dataclass
class Expired:
    """What `expire` did: the records it folded and deleted, and those it kept."""

    expired: int
    kept: int
    snapshot: str | None  # the `_expired-<id>.json` written (None when nothing expired)


def expire(
    folder: RecordFolder, older_than_s: float, *, now: float | None = None, dry_run: bool = False
) -> Expired:
    """Delete the archived records committed more than `older_than_s` seconds ago, keeping what
    they said in one expired snapshot (see the module docstring); `dry_run` counts them only.

    First every listed record is compacted (so an index holds all of them and the archive has
    them), then the old records and the earlier expired snapshots are folded into a new snapshot,
    written whole, and only then deleted: a kill leaves records beside a snapshot holding them."""
    if not dry_run:
        compact(folder, every=1)
    cutoff = (time.time() if now is None else now) - older_than_s
    names = [n for n in folder.list_names(ARCHIVE_DIR) if n.endswith(".json")]
    paths = [f"{ARCHIVE_DIR}/{n}" for n in names]
    if dry_run:  # nothing was compacted: the listed records count too
        listed = record_names(folder)
        names, paths = names + listed, paths + listed
    snap, gone, kept = Snapshot(), [], 0
    for path, name, body in zip(paths, names, _read_all(folder, paths, _raw), strict=True):
        if name.startswith(EXPIRED):
            part = Snapshot.parse(body or b"")
            if part is not None:
                snap.merge(part)
                gone.append(path)
            continue
        record = _json(body)
        if record is None or float(record.get("committed_at", now or time.time())) >= cutoff:
            kept += 1
            continue
        snap.add(record)
        gone.append(path)
    expired = sum(1 for p in gone if not p.rpartition("/")[2].startswith(EXPIRED))
    if expired == 0 or dry_run:
        return Expired(expired, kept, None)
    name = f"{ARCHIVE_DIR}/{EXPIRED}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    folder.write_bytes(name, snap.to_bytes())
    for path in gone:
        folder.delete(path)
    return Expired(expired, kept, name)


def _raw(folder: RecordFolder, name: str) -> bytes | None:
    return folder.read_bytes(name)


def _json(body: bytes | None) -> dict[str, Any] | None:
    if body is None:
        return None
    try:
        found = json.loads(body)
    except ValueError:  # not whole (a local write in progress), or damaged
        return None
    return found if isinstance(found, dict) else None


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _read_all(folder: RecordFolder, names: list[str], read: Callable[[Any, str], Any]) -> list[Any]:
    """`read(folder, name)` of each name, 16 at a time where the folder is remote (a round trip each)."""
    if len(names) <= 1 or not getattr(folder, "remote", False):
        return [read(folder, n) for n in names]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(names)), thread_name_prefix="rmqs-commits") as pool:
        return list(pool.map(lambda n: read(folder, n), names))


class ArrowFolder:
    """A `_rmqs_commits` folder on a pyarrow file system (an object store, or any local path)."""

    remote = True  # records are read in parallel (a round trip each)

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path = fs, path.rstrip("/")

    def list_names(self, sub: str = "") -> list[str]:
        from pyarrow import fs as pafs

        where = f"{self.path}/{sub}" if sub else self.path
        selector = pafs.FileSelector(where, allow_not_found=True)
        return [i.base_name for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]

    def read_bytes(self, name: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(f"{self.path}/{name}") as f:
                return bytes(f.read())
        except FileNotFoundError:  # any other error is raised: a record unread must not read as absent
            return None

    def write_bytes(self, name: str, body: bytes) -> None:
        """One object PUT: there whole or not at all (local folders use `FileCommits`'s rename)."""
        with self.fs.open_output_stream(f"{self.path}/{name}") as f:
            f.write(body)

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(f"{self.path}/{name}")
        except FileNotFoundError:
            pass

    def move(self, name: str, to: str) -> None:
        """The record written again under `to`, then deleted: it is in one place or both, never
        neither (a record gone already was moved by a compaction racing this one). A GET and a PUT,
        not a server-side copy: a record is a few hundred bytes, and fsspec's copy lists the
        target first to see whether it is a folder."""
        body = self.read_bytes(name)
        if body is None:
            return
        self.write_bytes(to, body)
        self.delete(name)


def _merge(spans: Iterable[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted((int(x), int(y)) for x, y in spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out
