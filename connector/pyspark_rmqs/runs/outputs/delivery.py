"""Exactly-once into files rmqs writes: range-keyed staging, an atomic publish, a commit record last.

The watermark protocol alone is at-least-once: a run that dies after its sink wrote but before the
watermark was stored writes the same range again on retry. For outputs rmqs writes itself, a run's
**token** is its planned range per partition stream plus the consumer name (the recorded plan makes
a retry's range, and so its token, the same). A run

1. writes its files to `<output>/_rmqs_staging/<token>.<attempt>/` (a `_` folder: Spark and pyarrow
   ignore it; one per attempt, so two attempts never write into one folder),
2. publishes them by renaming that folder to `<output>/rmqs_run=<token>/` (one atomic rename on a
   local or POSIX file system: readers see all of the run's files or none). The folder is named like
   a Hive partition, so `spark.read.parquet(output)` and pyarrow datasets read every run's files and
   show the run's token as a column `rmqs_run` (Spark reads no other subfolders without
   `recursiveFileLookup`); `partition_by` folders sit below it (`rmqs_run=<token>/col=value/`).
3. writes the commit record `<output>/_rmqs_commits/<token>.json` (token, ranges, files, rows) last,
4. and only then stores the watermark.

A retry that finds the commit record skips the sink and only stores the watermark; one that finds
the published folder without a record (it died between 2 and 3) writes the record; one that finds
only a staging folder writes the range again. Every offset appears exactly once in the output.

An exactly-once output folder holds rmqs runs only: files written there at-least-once (directly in
the folder) would give Spark two directory layouts to reconcile. Use a new folder when switching.

On an object store (`s3://`) there is no atomic rename: a Spark run's files cannot be published at
once, so `FileCommits` refuses such paths. The Spark-free consume writes there instead
(`StoreCommits`): each range straight to its final, range-keyed object (an upload appears whole or
not at all), then the commit record, the manifest of the run's objects, last; readers that must
never see an uncommitted run read through the manifests (`committed.py`).

Where a failure happened is part of the error (`commit_state`, see `errors.CommitState`): before
the commit (safe to retry), with the commit outcome unknown (the record answers), or after it (only
the watermark is left to store).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.runs.outputs import commit_index

log = logging.getLogger(__name__)

STAGING = "_rmqs_staging"
COMMITS = "_rmqs_commits"
RUN_COLUMN = "rmqs_run"
DELIVERY_MODES = ("exactly_once", "at_least_once")


def takes_token(fn: Any) -> bool:
    """Whether a user sink takes the run's token (`token=` keyword, or **kwargs)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "token" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_delivery(delivery: str) -> str:
    if delivery not in DELIVERY_MODES:
        raise ConfigurationError(f"delivery must be one of {', '.join(DELIVERY_MODES)}; got {delivery!r}")
    return delivery


@dataclass(frozen=True)
class RunToken:
    """A run's identity for commits: its consumer, planned ranges and the streams' incarnations.

    The same range of the same streams, the same token; a stream deleted and created again has a
    new incarnation (`runs.incarnation`), so its new `[0, n)` never matches an old commit.
    """

    consumer: str | None
    ranges: Mapping[str, tuple[int, int]]
    incarnations: Mapping[str, int] = field(default_factory=dict)

    @property
    def value(self) -> str:
        body: dict[str, Any] = {
            "consumer": self.consumer,
            "ranges": {s: list(r) for s, r in sorted(self.ranges.items())},
        }
        if self.incarnations:
            body["incarnations"] = {s: v for s, v in sorted(self.incarnations.items())}
        text = json.dumps(body, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def to_dict(self) -> dict[str, Any]:
        return {
            "token": self.value,
            "consumer": self.consumer,
            "ranges": {s: list(r) for s, r in self.ranges.items()},
            "incarnations": dict(self.incarnations),
        }


@dataclass
class CommitRecord:
    """What a committed run wrote: read back by a retry of the same range instead of writing again."""

    token: str
    consumer: str | None
    ranges: dict[str, list[int]]
    files: list[str]
    rows: int | None
    bytes: int | None
    committed_at: float = field(default_factory=time.time)
    incarnations: dict[str, int] = field(default_factory=dict)


def local_path(output: str) -> Path | None:
    """The local folder of `output` (a path or a `file:` URI); None for other file systems."""
    if output.startswith("file://"):
        return Path(output[len("file://") :])
    if output.startswith("file:"):
        return Path(output[len("file:") :])
    if "://" in output:
        return None
    return Path(output)


class FileCommits:
    """The staging folder, published folder and commit record of runs writing under `output`."""

    def __init__(self, output: str) -> None:
        root = local_path(output)
        if root is None:
            raise ConfigurationError(
                f"exactly-once delivery of Spark's files into '{output}' needs a local or mounted file "
                "system path (its publish is one folder rename, which object stores lack); for an "
                "object store use the Spark-free consume (RabbitMQStreamConsumeOperator, Dagster "
                "engine='arrow'), an Iceberg table, or delivery='at_least_once'"
            )
        self.root = root
        self.listed: int | None = None  # records listed by this run's `committed_spans`

    def staging(self, token: RunToken) -> Path:
        """The staging folder of one attempt at `token` (each attempt has its own: an attempt that
        lost its lease may still be writing while the next one starts)."""
        return self.root / STAGING / f"{token.value}.{uuid.uuid4().hex[:12]}"

    def published(self, token: RunToken) -> Path:
        return self.root / f"{RUN_COLUMN}={token.value}"

    def record_path(self, token: RunToken) -> Path:
        return self.root / COMMITS / f"{token.value}.json"

    def record(self, token: RunToken) -> CommitRecord | None:
        """The commit record of `token`, if the run committed (listed, or archived since)."""
        found = commit_index.read_record(self, f"{token.value}.json")
        return None if found is None else CommitRecord(**found)

    def committed_spans(self, token: RunToken) -> dict[str, list[tuple[int, int]]]:
        """Offsets of `token`'s ranges that earlier runs of its consumer already committed here.

        Commits are recognised per partition range, not only per whole token: when a watermark is
        put back (`rmqs watermark set`, or another client), the next run's range overlaps what the
        output holds, and only the rest is written. Read through the folder's index
        (`commit_index`): one listing, O(1) records and the index's spans whatever the history (its
        file list, which grows with the history, is left to readers). How many records were listed
        is kept: the run's commit decides from it whether to compact, without listing again.
        """
        snap = commit_index.snapshot(self, files=False)  # the spans: never the index's file list
        self.listed = len(snap.listed)
        return snap.spans_of(token.consumer, token.ranges, token.incarnations)

    # The `commit_index.RecordFolder` of `_rmqs_commits/`.
    remote = False

    def list_names(self, sub: str = "") -> list[str]:
        try:
            return os.listdir(self.root / COMMITS / sub)
        except OSError:
            return []

    def read_bytes(self, name: str) -> bytes | None:
        try:
            return (self.root / COMMITS / name).read_bytes()
        except FileNotFoundError:
            return None

    def write_bytes(self, name: str, body: bytes) -> None:
        """Whole or not at all: a temporary file, flushed, renamed into place."""
        write_atomically(self.root / COMMITS / name, body)

    def delete(self, name: str) -> None:
        (self.root / COMMITS / name).unlink(missing_ok=True)
        fsync_dir((self.root / COMMITS / name).parent)

    def move(self, name: str, to: str) -> None:
        """One rename (the target's folder made and flushed first; both folders flushed after); a
        record gone already was moved by a compaction racing this one."""
        src, dst = self.root / COMMITS / name, self.root / COMMITS / to
        if not dst.parent.is_dir():
            dst.parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(dst.parent.parent)
        try:
            os.replace(src, dst)
        except FileNotFoundError:
            return
        fsync_dir(dst.parent)
        fsync_dir(src.parent)

    def path_of(self, relative: str) -> str:
        """Where a file a record lists is (records hold paths relative to the output)."""
        return str(self.root / relative)

    def begin(self, token: RunToken) -> Path:
        """A new staging folder for this attempt at `token` (a dead attempt's are removed at commit)."""
        stage = self.staging(token)
        stage.parent.mkdir(parents=True, exist_ok=True)
        return stage

    def publish(self, token: RunToken, stage: Path) -> list[str]:
        """Rename the staged folder into the output in one step; returns the data files (relative paths).

        Spark's marker files (`_SUCCESS`, `.crc`) are dropped first, and every file is flushed to
        disk before the rename (a host crash after the commit record must not leave empty files).
        A published folder of this token left by an attempt that died before its record is replaced
        (it held the same range); a token already committed keeps its files (another attempt won).
        """
        for p in list(stage.rglob("*")):
            if p.is_file() and _hidden(p.relative_to(stage)):
                p.unlink()
            elif p.is_file():
                fsync_file(p)
        committed = self.record(token)
        if committed is not None:
            shutil.rmtree(stage, ignore_errors=True)
            return list(committed.files)
        final = self.published(token)
        if final.exists():
            shutil.rmtree(final)
        for d in [stage, *(p for p in stage.rglob("*") if p.is_dir())]:
            fsync_dir(d)
        os.replace(stage, final)
        fsync_dir(self.root)
        files = self.published_files(token)
        assert files is not None
        return files

    def published_files(self, token: RunToken) -> list[str] | None:
        """The files an unpartitioned run published (None when its folder is not there)."""
        final = self.published(token)
        if not final.is_dir():
            return None
        return sorted(str(p.relative_to(self.root)) for p in final.rglob("*") if p.is_file())

    def commit(self, token: RunToken, files: list[str], rows: int | None, size: int | None) -> CommitRecord:
        """Write the commit record (atomically: a temporary file renamed into place)."""
        record = new_record(token, files, rows, size)
        for folder in {(self.root / f).parent for f in files}:  # the files' own renames first
            fsync_dir(folder)
        write_atomically(self.record_path(token), json.dumps(asdict(record), indent=1).encode())
        self._tidy(token)
        _compact_quietly(self, self.listed)
        return record

    def _tidy(self, token: RunToken) -> None:
        """Once `token` is committed, every staging folder of its attempts is garbage."""
        staging = self.root / STAGING
        if not staging.is_dir():
            return
        for left in staging.glob(f"{token.value}.*"):
            shutil.rmtree(left, ignore_errors=True)
        try:
            staging.rmdir()  # only when empty
        except OSError:
            pass


def new_record(token: RunToken, files: list[str], rows: int | None, size: int | None) -> CommitRecord:
    """The commit record of `token`'s run: the manifest of its files (relative to the output)."""
    info = token.to_dict()
    return CommitRecord(
        info["token"], token.consumer, info["ranges"], files, rows, size, incarnations=info["incarnations"]
    )


class StoreCommits:
    """Commit records of runs writing into a folder of an object store (or any pyarrow FileSystem).

    The same records as `FileCommits`, at the same place (`<output>/_rmqs_commits/<token>.json`),
    each one object written in one PUT: it is there whole or not at all. Nothing is staged or
    renamed (an object store has no atomic rename): the sink writes each range to its final,
    range-keyed name (`consume.range_file_name`), whole or not at all, and this record, written
    after every one of them, is what makes the run committed (`committed.py` reads through it).
    """

    def __init__(self, location: Any) -> None:
        self.location = location  # objectstore.Location
        self.listed: int | None = None  # records listed by this run's `committed_spans`

    def record_path(self, token: RunToken) -> str:
        return self.location.path(f"{COMMITS}/{token.value}.json")

    def record(self, token: RunToken) -> CommitRecord | None:
        """The commit record of `token`, if the run committed (listed, or archived since)."""
        found = commit_index.read_record(self.folder(), f"{token.value}.json")
        return None if found is None else CommitRecord(**found)

    def committed_spans(self, token: RunToken) -> dict[str, list[tuple[int, int]]]:
        """As `FileCommits.committed_spans`: through the folder's index, O(1) records read."""
        snap = commit_index.snapshot(self.folder(), files=False)
        self.listed = len(snap.listed)
        return snap.spans_of(token.consumer, token.ranges, token.incarnations)

    def folder(self) -> commit_index.ArrowFolder:
        return commit_index.ArrowFolder(self.location.fs, self.location.path(COMMITS))

    def path_of(self, relative: str) -> str:
        return str(self.location.uri_of(relative))

    def commit(self, token: RunToken, files: list[str], rows: int | None, size: int | None) -> CommitRecord:
        """Write the commit record: one object, after every file of the run is complete."""
        record = new_record(token, files, rows, size)
        with self.location.fs.open_output_stream(self.record_path(token)) as f:
            f.write(json.dumps(asdict(record), indent=1).encode())
        _compact_quietly(self.folder(), self.listed)
        return record


def _compact_quietly(folder: commit_index.RecordFolder, listed: int | None) -> None:
    """After a commit: fold the records into the index when enough are listed (`listed`: how many
    the run saw before its commit; None lists them). The run is committed already (its record is
    written); an index that could not be written is only slower."""
    try:
        commit_index.compact(folder, listed=listed)
    except Exception:
        log.warning(
            "compacting the commit records' index failed (the records stay authoritative)", exc_info=True
        )


def merged_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half-open spans, sorted, with overlapping and touching ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def covers(spans: Mapping[str, list[tuple[int, int]]], ranges: Mapping[str, tuple[int, int]]) -> bool:
    """Whether `spans` hold every offset of `ranges` (so nothing is left to write)."""
    return all(spans.get(s) == [r] for s, r in ranges.items() if r[1] > r[0])


def _hidden(rel: Path) -> bool:
    return any(part.startswith(("_", ".")) for part in rel.parts)


def write_atomically(path: Path, body: bytes) -> None:
    """`body` at `path` whole or not at all, on disk: a temporary file beside it (`<name>.<id>.tmp`,
    which readers of `*.json` skip), flushed, renamed into place, the folder flushed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_bytes(body)
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    """Flush a file's data to disk (its rename or the record naming it comes next)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
