"""A compacted index of an output's commit records, so that a run and a reader read O(1) of them.

Every exactly-once run writes one commit record (`_rmqs_commits/<token>.json`, `delivery.py`): the
manifest of its files, and the proof a retry of its range finds. A run also needs what *earlier*
runs of its consumer committed (`committed_spans`: a watermark put back must not write a range
twice), and a reader needs every committed file (`committed.py`). Reading every record for that
costs a round trip per earlier run: 2.5 ms more per run on an object store, linear in the history.

So, as Spark's file sink log compacts every N batches: every `COMPACT_EVERY` records, a run folds
the records into one index object, `_rmqs_commits/_index/index.json` (the tokens it covers, the
committed offset spans merged per consumer, stream and stream incarnation, and the files). A run or
a reader then lists the record names (one listing, names only), reads the index and reads only the
records the index does not cover (fewer than `COMPACT_EVERY`, unless a compaction failed).

A record is written once per token and never changed (a retry that finds it writes nothing), so
the index keeps a token it covers. The records stay the source of truth: the index is written whole
or not at all (a rename, or one object PUT), only ever from records that exist, and anything it
does not cover is read from the records themselves. A lost index, a stale one, or two runs
compacting at once (the last write wins; what it lacks is read raw) never hides a commit;
deleting the `_index` folder is always safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark_rmqs.runs.incarnation import UNMARKED
from pyspark_rmqs.runs.incarnation import same as same_incarnation

INDEX_DIR = "_index"
INDEX = "index.json"
COMPACT_EVERY = 16  # records outside the index before a run folds them in
VERSION = 1
_NO_CONSUMER = "\u0000"  # a record without a consumer name (an index key must be a string)

Spans = dict[str, dict[str, dict[str, list[list[int]]]]]  # consumer -> stream -> incarnation -> spans


class RecordFolder(Protocol):
    """A `_rmqs_commits` folder: its record names, a record, and the index (local or object store)."""

    def record_names(self) -> list[str]: ...

    def read_record(self, name: str) -> dict[str, Any] | None: ...

    def read_index(self) -> dict[str, Any] | None: ...

    def write_index(self, body: bytes) -> None: ...


@dataclass
class Snapshot:
    """Every committed record of a folder, as the index and the records outside it say."""

    tokens: set[str] = field(default_factory=set)
    spans: Spans = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    unindexed: int = 0  # records read raw (outside the index)

    def add(self, record: Mapping[str, Any], name: str = "") -> None:
        """Fold one record in (`name`: its token, from its file name, where the record lacks one)."""
        token = str(record.get("token") or name)
        if not token or token in self.tokens:
            return
        self.tokens.add(token)
        self.files.extend(str(f) for f in record.get("files", []))
        consumer = record.get("consumer")
        by_stream = self.spans.setdefault(_NO_CONSUMER if consumer is None else str(consumer), {})
        incarnations = record.get("incarnations") or {}
        for stream, span in (record.get("ranges") or {}).items():
            a, b = int(span[0]), int(span[1])
            if a >= b:
                continue
            key = str(int(incarnations.get(stream) or UNMARKED))
            incs = by_stream.setdefault(stream, {})
            incs[key] = _merge([*incs.get(key, []), [a, b]])  # merged: a history of runs is one span

    def to_json(self) -> bytes:
        body = {"version": VERSION, "tokens": sorted(self.tokens), "spans": self.spans, "files": self.files}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, body: Mapping[str, Any] | None) -> Snapshot:
        if not body or body.get("version") != VERSION:
            return cls()
        return cls(set(body.get("tokens", [])), body.get("spans", {}), list(body.get("files", [])))

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
    """The folder's commits: the index, plus every record it does not cover (read raw)."""
    return _read_outside(folder, *_outside(folder))


def _read_outside(folder: RecordFolder, snap: Snapshot, outside: list[str]) -> Snapshot:
    for token, record in zip(outside, _read_all(folder, [f"{t}.json" for t in outside]), strict=True):
        if record is not None:
            snap.add(record, token)
            snap.unindexed += 1
    return snap


def compact(folder: RecordFolder, *, every: int | None = None) -> bool:
    """Fold the records outside the index into it once there are `every` (`COMPACT_EVERY`, read at
    the call: the campaign lowers it) of them; True when written.

    Below that, one listing and the index only (no record is read): the common case after a run."""
    snap, outside = _outside(folder)
    if len(outside) < (COMPACT_EVERY if every is None else every):
        return False
    folder.write_index(_read_outside(folder, snap, outside).to_json())
    return True


def _outside(folder: RecordFolder) -> tuple[Snapshot, list[str]]:
    """The index, and the tokens of the records it does not cover (from one listing of names)."""
    names = folder.record_names()
    snap = Snapshot.from_json(folder.read_index())
    return snap, [t for t in (n[: -len(".json")] for n in names) if t not in snap.tokens]


def _read_all(folder: RecordFolder, names: list[str]) -> list[dict[str, Any] | None]:
    """The records, 16 at a time where the folder is remote (each a round trip to the store)."""
    if len(names) <= 1 or not getattr(folder, "remote", False):
        return [folder.read_record(n) for n in names]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(names)), thread_name_prefix="rmqs-commits") as pool:
        return list(pool.map(folder.read_record, names))


class ArrowFolder:
    """A `_rmqs_commits` folder on a pyarrow file system (an object store, or any local path)."""

    remote = True  # records are read in parallel (a round trip each)

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path = fs, path.rstrip("/")

    def record_names(self) -> list[str]:
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(self.path, allow_not_found=True)
        return [
            i.base_name
            for i in self.fs.get_file_info(selector)
            if i.type == pafs.FileType.File
            and i.base_name.endswith(".json")
            and not i.base_name.startswith("_")
        ]

    def _read(self, path: str) -> dict[str, Any] | None:
        try:
            with self.fs.open_input_stream(path) as f:
                found = json.loads(f.read())
        except (OSError, ValueError):  # absent, or not whole (a local write in progress)
            return None
        return found if isinstance(found, dict) else None

    def read_record(self, name: str) -> dict[str, Any] | None:
        return self._read(f"{self.path}/{name}")

    def read_index(self) -> dict[str, Any] | None:
        return self._read(f"{self.path}/{INDEX_DIR}/{INDEX}")

    def write_index(self, body: bytes) -> None:
        """One object PUT: it is there whole or not at all (local folders use `FileCommits`'s rename)."""
        with self.fs.open_output_stream(f"{self.path}/{INDEX_DIR}/{INDEX}") as f:
            f.write(body)


def _merge(spans: Iterable[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted((int(x), int(y)) for x, y in spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out
