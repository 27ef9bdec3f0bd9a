"""A compacted index of an output's commit records, so that a run and a reader touch O(1) of them.

Every exactly-once run writes one commit record (`_rmqs_commits/<token>.json`, `delivery.py`): the
manifest of its files, and the proof a retry of its range finds. A run also needs what *earlier*
runs of its consumer committed (`committed_spans`: a watermark put back must not write a range
twice), and a reader needs every committed file (`committed.py`). Reading or even listing every
record costs a round trip (or a listed key) per earlier run, linear in the history.

So, as Spark's file sink log compacts every N batches: once `COMPACT_EVERY` records sit in the
folder, a run folds them into an index, and then moves the records it folded into
`_rmqs_commits/_archive/`, out of the listed folder. An index is two objects with one id:

- `_rmqs_commits/_index-<id>.json`, in the listed folder itself: the committed offset spans merged
  per consumer, stream and stream incarnation (a history of runs is one span: a few hundred bytes
  whatever the history). All a run reads.
- `_rmqs_commits/_files/<id>.json`: every committed file. Only readers and compactions read it
  (its size is the answer `committed_files` gives: O(files), inherently).

A run lists the folder once (fewer than `COMPACT_EVERY` records and one index object, a few while
compactions race) and reads those objects in parallel: no second listing, no file list.

Crash safety, the order of a compaction (`compact`):

1. read every index object (spans and files) and every listed record (a record listed but gone was
   archived by a concurrent compaction meanwhile: it is read from the archive);
2. write their union: the files object, then the spans object naming the same id (and the spans
   objects it replaces: those it read), each whole or not at all (a rename, or one object PUT). An
   index is listed by its spans object only, so it is never seen without its files;
3. delete the index objects it read (the new one holds everything they held): first the files
   objects of the indexes *they* replaced, where a kill left them (their spans objects no longer
   listed), then the spans objects, then their files objects (a kill in between leaves files
   objects that no listing shows and no read reads, named by the new index: the next compaction
   deletes them);
4. move the records it folded into `_archive/` (a rename; copy then delete on an object store).

So a token is always in a listed record or in an index present, and a read unions every index it
lists (an index deleted between the listing and its read is subsumed by a newer one: it lists
again). The folder is listed once for both the records and the index objects; a listing is not
an atomic snapshot, but a record is moved only after every index object its compaction read was
deleted, so a listing that missed a moved record either lists the new index, or lists an old one
that reads as gone (and lists again), or lists none (and reads the archive). A kill anywhere
leaves a record both listed and indexed, or two indexes, which the union reads as one. Two runs
compacting at once each write their own index and delete only what they read, so neither hides
the other's records. Nothing is ever overwritten.

The records stay the source of truth: `_archive/` and the listed records hold every commit (with
`_archive/_expired-<id>.json`, what `expire` folded, see below). Where no index is present or one
cannot be parsed (deleted or damaged by hand), a read lists the archive and reads it whole
(O(history), once: the next compaction writes a complete index again). Deleting the index
(`_index-*.json`, `_files/`) is safe.

Indexes of earlier versions (one object holding both, in `_rmqs_commits/_index/`, format 1 or 2)
are still read, whole, wherever the listing shows an `_index/` folder; the next compaction folds
them into the new layout and deletes them.

A late retry of an archived run finds its record in `_archive/` (`delivery`'s `record`). Retention
(`expire`, the `rmqs commits expire` command): archived records older than a cutoff are folded
into one `_expired-<id>.json` snapshot in the archive (spans and files, written before the records
are deleted) and deleted. The index keeps their spans and files, so readers still list their files
and a late retry of an expired run, whose record is gone, finds its whole range committed
(`committed_spans`) and writes nothing again. It also deletes the files objects no index lists
that are older than an hour (`sweep`: a compaction killed between its two writes left them).
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

INDEX_PREFIX = "_index-"  # an index's spans object, in the listed folder
FILES_DIR = "_files"  # an index's files object
INDEX_DIR = "_index"  # the index objects of earlier versions (spans and files in one object)
ARCHIVE_DIR = "_archive"
EXPIRED = "_expired-"  # an `expire` snapshot's name in the archive
COMPACT_EVERY = 16  # records in the listed folder before a run folds them in
VERSION = 3  # an index's spans object
SNAPSHOT_VERSION = 2  # an expired snapshot (and an index of the previous version): spans, then files
_NO_CONSUMER = "\u0000"  # a record without a consumer name (an index key must be a string)
ORPHAN_GRACE_S = 3600.0  # `sweep`: a files object without its spans object this much older is left over
_RELISTS = 5  # an index object gone between listing and read: list again (then read the archive)

Spans = dict[str, dict[str, dict[str, list[list[int]]]]]  # consumer -> stream -> incarnation -> spans


class RecordFolder(Protocol):
    """A `_rmqs_commits` folder (local or object store), addressed by `/`-separated relative names."""

    remote: bool  # a round trip per object: reads go in parallel

    def list_names(self, sub: str = "") -> list[str]:
        """The names directly in `sub` (the folder itself by default; [] when absent): files and
        folders (a folder's name has no `/`; an object store shows a prefix holding objects)."""
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
    return _records(folder.list_names())


def _records(names: Iterable[str]) -> list[str]:
    return [n for n in names if n.endswith(".json") and not n.startswith(("_", "."))]


def files_name(index: str) -> str:
    """The files object of the index whose spans object is `index` (`_index-<id>.json`)."""
    return f"{FILES_DIR}/{index[len(INDEX_PREFIX) :]}"


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
    with_files: bool = True  # False: an index's files object was not read (a run's snapshot)
    # The spans objects the listed indexes say they replaced (`compact`: their files objects may be
    # left behind by a kill, and are deleted by the next compaction)
    replaced: list[str] = field(default_factory=list)
    _files: dict[str, None] = field(default_factory=dict)
    _unparsed: list[bytes] = field(default_factory=list)  # file lists, parsed on demand

    @property
    def files(self) -> list[str]:
        """Every committed file, each once (parsed only when asked: a reader's, a compaction's)."""
        if not self.with_files:
            raise ValueError("this snapshot was read without the index's file list (snapshot(files=True))")
        for chunk in self._unparsed:  # written by `files_bytes` or `to_bytes`: a list of strings
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
        """Fold another snapshot in (an index, an expired snapshot)."""
        self.runs += other.runs
        self._add_spans(other.spans)
        self._files.update(other._files)
        self._unparsed += other._unparsed
        self.with_files = self.with_files and other.with_files

    def _add_spans(self, spans: Spans) -> None:
        for consumer, streams in spans.items():
            by_stream = self.spans.setdefault(consumer, {})
            for stream, incs in streams.items():
                mine = by_stream.setdefault(stream, {})
                for key, found in incs.items():
                    merged = _merge([*mine.get(key, []), *(s for s in found if s[0] < s[1])])
                    if merged:  # merged: a history of runs is one span
                        mine[key] = merged

    def head_bytes(self, replaced: Iterable[str] = ()) -> bytes:
        """An index's spans object: one line, all a run reads. `replaced`: the spans objects of the
        indexes it replaces (read by the compaction writing it; readers of earlier versions ignore
        the key)."""
        head: dict[str, Any] = {"version": VERSION, "runs": self.runs, "spans": self.spans}
        if replaced:
            head["replaced"] = sorted(replaced)
        return _dumps(head) + b"\n"

    def files_bytes(self) -> bytes:
        """An index's files object: the list of files."""
        return _dumps(self.files) + b"\n"

    def to_bytes(self) -> bytes:
        """An expired snapshot, one object of two lines: the spans, then the files."""
        head = {"version": SNAPSHOT_VERSION, "runs": self.runs, "spans": self.spans}
        return b"%s\n%s\n" % (_dumps(head), _dumps(self.files))

    @classmethod
    def parse(cls, body: bytes, files: bytes | None = None) -> Snapshot | None:
        """An index (its spans object, and its files object when read) or an expired snapshot or an
        index of an earlier version (one object); None when it is not one (damaged)."""
        head_line, _, rest = body.partition(b"\n")
        try:
            head = json.loads(head_line)
        except ValueError:
            return None
        if not isinstance(head, dict):
            return None
        if head.get("version") == 1:  # an index of the first format: one object, `index.json`
            found = dict.fromkeys(str(f) for f in head.get("files", []))
            return cls(len(head.get("tokens", [])), head.get("spans", {}), _files=found)
        if head.get("version") == SNAPSHOT_VERSION and rest.strip():
            return cls(int(head.get("runs", 0)), head.get("spans", {}), _unparsed=[rest])
        if head.get("version") != VERSION:
            return None
        if files is None:
            return cls(int(head.get("runs", 0)), head.get("spans", {}), with_files=False)
        try:  # parsed here, not on demand: a damaged files object must read as a damaged index
            listed = json.loads(files)
        except ValueError:
            return None
        if not isinstance(listed, list):
            return None
        return cls(int(head.get("runs", 0)), head.get("spans", {}), _files=dict.fromkeys(map(str, listed)))

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


def snapshot(folder: RecordFolder, *, files: bool = True) -> Snapshot:
    """The folder's commits: the index, plus every listed record (read raw). `files=False` (a run:
    spans only) leaves out the index's file list, the one part of it that grows with the history."""
    return _snapshot(folder, files)[0]


def _snapshot(folder: RecordFolder, files: bool) -> tuple[Snapshot, list[str], list[str]]:
    """The snapshot, the index objects it listed (spans objects, and earlier versions' objects) and
    the listed records it folded in.

    One listing names both the records and the index, and every object is then read in one
    parallel round (records with the index): a run pays one listing and one round trip of reads."""
    indexes: list[str] = []
    listed: list[str] = []
    records: list[Any] = []
    bodies: dict[str, bytes | None] = {}
    for _ in range(_RELISTS):
        names = folder.list_names()
        listed = _records(names)
        indexes = sorted(n for n in names if n.startswith(INDEX_PREFIX) and n.endswith(".json"))
        if INDEX_DIR in names:  # an earlier version's index objects: read whole until compacted
            indexes += [f"{INDEX_DIR}/{n}" for n in folder.list_names(INDEX_DIR) if n.endswith(".json")]
        wanted = [*indexes, *(files_name(n) for n in indexes if files and n.startswith(INDEX_PREFIX))]
        found = _read_all(folder, [*wanted, *listed], _read_any)
        bodies, records = dict(zip(wanted, found[: len(wanted)], strict=True)), found[len(wanted) :]
        if all(b is not None for b in bodies.values()):
            break  # else deleted since the listing: a newer index holds what it held
    # An object gone at every listing makes the union damaged (`_union`: the archive answers), but
    # the spans objects read still name the indexes they replaced, whose files objects a kill may
    # have left: they are kept for `replaced` (they were dropped, and the next compaction left those
    # files objects behind: the commit index generator's history of a damaged index, a stale one
    # put back and a compaction killed between its deletes)
    snap = _union(indexes, bodies, files)
    if snap is None:  # no index, or a damaged one: the archive answers
        snap = _archive(folder)
    snap.listed = listed
    snap.replaced = sorted(
        {r for n in indexes if n.startswith(INDEX_PREFIX) for r in _replaced(bodies.get(n))}
    )
    folded = []
    for name, record in zip(listed, records, strict=True):
        if record is not None:
            snap.add(record)
            snap.unindexed += 1
            folded.append(name)
    return snap, indexes, folded


def _replaced(body: bytes | None) -> list[str]:
    """The spans objects an index's spans object says it replaced ([] when it names none, or
    cannot be parsed: what it named is then left for `sweep`)."""
    head = _json((body or b"").partition(b"\n")[0])
    names = head.get("replaced") if head is not None else None
    if not isinstance(names, list):
        return []
    return [str(n) for n in names if str(n).startswith(INDEX_PREFIX) and "/" not in str(n)]


def _read_any(folder: RecordFolder, name: str) -> Any:
    """An index object's bytes, or a listed record (parsed; read from the archive once moved)."""
    return folder.read_bytes(name) if name.startswith("_") else read_record(folder, name)


def _union(indexes: list[str], bodies: Mapping[str, bytes | None], files: bool) -> Snapshot | None:
    """The union of the index objects read (None when there is none, or one is missing or damaged)."""
    if not indexes:
        return None
    snap = Snapshot(with_files=files)
    for name in indexes:
        body = bodies.get(name)
        if body is None:
            return None
        if name.startswith(INDEX_PREFIX):
            listed = bodies.get(files_name(name)) if files else None
            if files and listed is None:
                return None
            part = Snapshot.parse(body, listed)
        else:  # an earlier version's: spans and files in one object
            part = Snapshot.parse(body)
            part = part if part is not None and part.with_files else None
        if part is None:
            return None
        snap.merge(part)
    return snap


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
    snap, indexes, folded = _snapshot(folder, True)
    if len(snap.listed) < every:
        return False
    new = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    read = [n for n in indexes if n.startswith(INDEX_PREFIX)]
    # 2. the files first, then the spans object that lists the index (naming the spans objects it
    # replaces): each whole or not at all
    folder.write_bytes(f"{FILES_DIR}/{new}", snap.files_bytes())
    folder.write_bytes(f"{INDEX_PREFIX}{new}", snap.head_bytes(replaced=read))
    # 3. every object read is held by the new index. First the files objects that the indexes read
    # replaced and that a kill may have left (their spans objects are gone, not listed: never read
    # again, and no other index names them), then the spans objects read (no longer listed), then
    # their files objects (a kill in between leaves files objects the new index names)
    left = [files_name(n) for n in snap.replaced if n not in indexes]
    _read_all(folder, left, lambda f, n: f.delete(n))
    _read_all(folder, indexes, lambda f, n: f.delete(n))
    _read_all(folder, [files_name(n) for n in read], lambda f, n: f.delete(n))
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
    swept: int = 0  # left-over files objects deleted (`sweep`)


def expire(
    folder: RecordFolder, older_than_s: float, *, now: float | None = None, dry_run: bool = False
) -> Expired:
    """Delete the archived records committed more than `older_than_s` seconds ago, keeping what
    they said in one expired snapshot (see the module docstring); `dry_run` counts them only.

    First every listed record is compacted (so an index holds all of them and the archive has
    them), then the old records and the earlier expired snapshots are folded into a new snapshot,
    written whole, and only then deleted: a kill leaves records beside a snapshot holding them."""
    swept = 0
    if not dry_run:
        compact(folder, every=1)
        swept = sweep(folder)
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
        return Expired(expired, kept, None, swept)
    name = f"{ARCHIVE_DIR}/{EXPIRED}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    folder.write_bytes(name, snap.to_bytes())
    for path in gone:
        folder.delete(path)
    return Expired(expired, kept, name, swept)


def sweep(folder: RecordFolder, *, grace_s: float | None = None, now: float | None = None) -> int:
    """Delete the files objects no spans object lists, written more than `grace_s`
    (`ORPHAN_GRACE_S`) ago; how many. `expire` runs it.

    A compaction deletes the files objects of the indexes it replaced once their spans objects are
    gone (`compact`, by the names its index holds); what no index names is the files object of a
    compaction killed between its two writes, or of rmqs before the names were kept. Such an
    object looks like a compaction's between its writes (milliseconds apart, its id the time of
    the first), so only one older than the grace is deleted: no reader ever reads it."""
    grace = ORPHAN_GRACE_S if grace_s is None else grace_s
    before = (time.time() if now is None else now) - grace
    listed = {n[len(INDEX_PREFIX) :] for n in folder.list_names() if n.startswith(INDEX_PREFIX)}
    left = [
        f"{FILES_DIR}/{n}"
        for n in folder.list_names(FILES_DIR)
        if n.endswith(".json") and n not in listed and _written_at(n) < before
    ]
    _read_all(folder, left, lambda f, n: f.delete(n))
    return len(left)


def _written_at(name: str) -> float:
    """When an index with this id was written (its id starts with the time in ns; never for an
    id that does not)."""
    try:
        return int(name.partition("-")[0]) / 1e9
    except ValueError:
        return float("inf")


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
    """A `_rmqs_commits` folder on a pyarrow file system (an object store, or any local path).

    On an fsspec file system (`storage_options`: s3fs, gcsfs, ...) each call is the one request
    the protocol needs, made through fsspec itself: pyarrow's `FSSpecHandler` asks whether a path
    is a file or a folder before reading, deleting or listing it (on S3 a HEAD, and for an absent
    object a listing too), which doubled or tripled a run's requests on its output, and a listing
    costs the more the more the bucket holds on some stores (moto's server scans every key)."""

    remote = True  # records are read in parallel (a round trip each)

    def __init__(self, fs: Any, path: str) -> None:
        from pyspark_rmqs.runs.outputs.objectstore import fsspec_of

        self.fs, self.path = fs, path.rstrip("/")
        self.fsspec = fsspec_of(fs)
        # s3fs's `cat_file` asks for the size first (a HEAD, or its listing cache, which another
        # process's writes make stale) to read large objects in parts: one part is one GET
        self._whole = {"max_concurrency": 1} if _takes(self.fsspec, "_cat_file", "max_concurrency") else {}

    def list_names(self, sub: str = "") -> list[str]:
        where = f"{self.path}/{sub}" if sub else self.path
        if self.fsspec is not None:  # one listing, fresh (`objectstore.list_folder`)
            from pyspark_rmqs.runs.outputs.objectstore import list_folder

            found = (str(e["name"]).rstrip("/") for e in list_folder(self.fsspec, where))
            return [n.rpartition("/")[2] for n in found if n != where.rstrip("/")]
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(where, allow_not_found=True)
        return [i.base_name for i in self.fs.get_file_info(selector) if i.type != pafs.FileType.NotFound]

    def read_bytes(self, name: str) -> bytes | None:
        try:
            if self.fsspec is not None:  # one GET, absent or not
                return bytes(self.fsspec.cat_file(f"{self.path}/{name}", **self._whole))
            with self.fs.open_input_stream(f"{self.path}/{name}") as f:
                return bytes(f.read())
        except FileNotFoundError:  # any other error is raised: a record unread must not read as absent
            return None

    def write_bytes(self, name: str, body: bytes) -> None:
        """One object PUT: there whole or not at all (local folders use `FileCommits`'s rename)."""
        if self.fsspec is not None:
            self.fsspec.pipe_file(f"{self.path}/{name}", body)
            return
        with self.fs.open_output_stream(f"{self.path}/{name}") as f:
            f.write(body)

    def delete(self, name: str) -> None:
        try:
            if self.fsspec is not None:
                self.fsspec.rm_file(f"{self.path}/{name}")
            else:
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


def _takes(obj: Any, method: str, arg: str) -> bool:
    import inspect

    try:
        return arg in inspect.signature(getattr(type(obj), method)).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def _merge(spans: Iterable[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted((int(x), int(y)) for x, y in spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out
