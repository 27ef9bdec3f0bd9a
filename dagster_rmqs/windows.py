"""Time-window partitions by the broker's clock, and a window's output replaced whole.

A window `[S, E)` reads, per partition stream, `[offset at S, offset at E)`: the first offset of the
first chunk the broker timestamped at or after each time (`BrokerClient.time_bounds`). The window
is **closed** only when, on every partition stream, the broker holds a chunk timestamped at or
after `E`: then its end is that chunk's offset, which is also where the next window starts, so
adjacent windows meet exactly (no offset in two windows, none in neither). Otherwise it is **open**
and ends at the tail measured before the broker showed that nothing had reached `E`. The Dagster
process's clock decides nothing: when it says that `E` passed and the broker shows no chunk that
late (an idle stream), the broker is asked to timestamp one (`stamp_clock`, an offset-tracking
entry), and its answer decides. That decision is `pyspark_rmqs.broker.positions.broker_time_bounds`,
the one Airflow's time ranges use too (`check_time_end`).

An open window's output is incomplete, and materializing the window again after it closed must not
add its rows a second time. Outputs rmqs writes into files are kept per window, under
`<output_path>/rmqs_window=<partition key>/`, and a materialization replaces that folder's content
whole (`keep_only`). A sink function's rows cannot be taken back: there an open window is refused
(`OpenWindowError`) unless the asset allows it. The error is `pyspark_rmqs.errors.OpenWindowError`,
kept here by name, and the one Airflow's time ranges raise too: retryable, since the window closes
with time (a `retry_policy` with a delay reads it then).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from dagster_rmqs.engines import Engine
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.positions import broker_time_bounds, describe_open, open_on
from pyspark_rmqs.core.codec import to_millis
from pyspark_rmqs.errors import OpenWindowError as OpenWindowError
from pyspark_rmqs.runs.outputs.delivery import (
    COMMITS,
    STAGING,
    FileCommits,
    RunToken,
    StoreCommits,
    local_path,
)

log = logging.getLogger(__name__)

WINDOW_COLUMN = "rmqs_window"
# Spark's file sources read these from folders with partition discovery (`rmqs_window=<key>`).
FILE_FORMATS = frozenset({"parquet", "orc", "json", "csv", "avro", "text"})
# The characters Spark escapes in a partition folder's value (ExternalCatalogUtils.escapePathName).
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^")


@dataclass(frozen=True)
class Window:
    """One partition's window: its offsets per partition stream, and where it is still open."""

    key: str
    start: datetime
    end: datetime
    start_offsets: dict[str, int]
    end_offsets: dict[str, int]
    # Partition streams on which the broker has no chunk at or after `end`: their newest chunk's
    # timestamp (epoch ms; None for an empty stream).
    open_on: dict[str, int | None] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        return bool(self.open_on)

    def describe_open(self) -> str:
        return (
            f"window '{self.key}' [{self.start.isoformat()}, {self.end.isoformat()}) is still open by the "
            f"broker's clock ({describe_open(self.end, self.open_on)}); it closes when the broker's clock "
            f"reaches {self.end.isoformat()}"
        )


def locate(
    client: BrokerClient, streams: Sequence[str], spans: Sequence[tuple[str, Any]], now: datetime
) -> list[Window]:
    """The offsets of each `(key, TimeWindow)` of `spans` on `streams`, by the broker's clock.

    `now` (the Dagster process's clock) only decides whether to make the broker timestamp a chunk
    (`stamp_clock`): when the end of a window it says ended shows no chunk on the broker yet.
    """
    times = {to_millis(w.start) for _, w in spans} | {to_millis(w.end) for _, w in spans}
    ended = {to_millis(w.end) for _, w in spans if w.end <= now}  # by the Dagster process's clock
    at = broker_time_bounds(client, streams, times, ended=ended)
    out = []
    for key, w in spans:
        start, end = at[to_millis(w.start)], at[to_millis(w.end)]
        out.append(
            Window(
                key,
                w.start,
                w.end,
                {s: b.offset for s, b in start.items()},
                {s: b.offset for s, b in end.items()},
                open_on(end),
            )
        )
    return out


def escape_key(key: str) -> str:
    """A partition key as a folder value, escaped as Spark escapes partition values (`:` is `%3A`)."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED or ord(c) < 0x20 else c for c in key)


def window_path(output_path: str, key: str) -> str:
    """The folder holding window `key`'s output: `<output_path>/rmqs_window=<key>`."""
    return f"{output_path.rstrip('/')}/{WINDOW_COLUMN}={escape_key(key)}"


def replaces_windows(engine: Engine) -> bool:
    """Whether a window's output can be replaced whole: files rmqs writes (Parquet without Spark, a
    file format with Spark), not a sink function nor a table format (Delta, Iceberg, ...)."""
    o = engine.output
    if o.sink is not None or not o.path:
        return False
    return engine.name == "arrow" or o.format.lower() in FILE_FORMATS


def commits_runs(engine: Engine) -> bool:
    """Whether the engine commits each run's files under its range token (else Spark overwrites)."""
    o = engine.output
    return engine.name == "arrow" or (o.delivery == "exactly_once" and o.mode == "append")


def window_engine(engine: Engine, key: str) -> Engine:
    """`engine` writing window `key`'s own folder: committed per run, or overwritten by Spark."""
    o = engine.output
    assert o.path, "only file outputs have window folders"
    mode = o.mode if commits_runs(engine) else "overwrite"
    return engine.with_output(replace(o, path=window_path(o.path, key), mode=mode, replaces=True))


def keep_only(
    folder: str,
    token: RunToken,
    written: Sequence[str] = (),
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Remove from a window's folder every output but the run `token`'s: the window is replaced whole.

    The run's commit record (`delivery.py`; on an object store `StoreCommits`, reached with
    `storage_options`) names what it wrote; without one, `written` does. Commit records of earlier
    runs go first, then their files: an interrupted clean-up leaves files a later materialization
    removes, never a record whose files are gone (which would make a run of that range skip writing
    them). The run's own record, if a compaction archived it (`commit_index`), is listed again
    first; the index and the archive, which name the other runs, go with their records.
    """
    root = local_path(folder)
    if root is None:
        _keep_only_remote(folder, token, set(written), storage_options)
        return
    if not root.is_dir():
        return
    commits = FileCommits(folder)
    record = commits.record(token) if token.ranges else None
    kept = {Path(f).parts[0] for f in record.files} if record is not None else set()
    records = root / COMMITS
    own = f"{token.value}.json"
    if record is not None and commits.read_bytes(own) is None:  # archived by a compaction
        commits.write_bytes(own, json.dumps(asdict(record), indent=1).encode())  # listed again first
    if records.is_dir():
        for r in records.iterdir():  # other runs' records, the index and the archive
            if r.name != own:
                shutil.rmtree(r) if r.is_dir() else r.unlink()
    for entry in root.iterdir():
        if entry.name in (COMMITS, STAGING) or entry.name in kept:
            continue
        log.info("replacing window output: removing %s", entry)
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _keep_only_remote(
    folder: str, token: RunToken, written: set[str], storage_options: Mapping[str, Any] | None
) -> None:
    """`keep_only` on an object store: other runs' records first, then every object but this run's."""
    from pyarrow import fs

    from pyspark_rmqs.runs.outputs.objectstore import locate

    where = locate(folder, storage_options=storage_options)
    commits = StoreCommits(where)
    record = commits.record(token) if token.ranges else None
    own = commits.record_path(token)
    store = commits.folder()
    if record is not None and store.read_bytes(f"{token.value}.json") is None:  # archived: listed again
        store.write_bytes(f"{token.value}.json", json.dumps(asdict(record), indent=1).encode())
    kept = {where.path(f) for f in record.files} if record is not None else set()
    kept |= {where.path(where_relative(where, f)) for f in written}
    infos = where.fs.get_file_info(fs.FileSelector(where.base, recursive=True, allow_not_found=True))
    files = [i.path for i in infos if i.type == fs.FileType.File]
    records = [p for p in files if p.startswith(where.path(COMMITS) + "/") and p != own]
    for path in records + [p for p in files if p not in records and p != own and p not in kept]:
        log.info("replacing window output: removing %s", path)
        where.fs.delete_file(path)


def where_relative(where: Any, name: str) -> str:
    """A written file (a URI, a file system path or a relative name) relative to the folder."""
    prefix = f"{where.uri.rstrip('/')}/"
    return name[len(prefix) :] if name.startswith(prefix) else where.relative(name)


def remove(folder: str) -> None:
    """Remove a window's folder (a window with nothing to read replaces its output with nothing)."""
    root = local_path(folder)
    if root is not None and root.is_dir():
        shutil.rmtree(root)
    elif root is None:
        log.warning("window output %s holds an earlier materialization; it cannot be removed here", folder)
