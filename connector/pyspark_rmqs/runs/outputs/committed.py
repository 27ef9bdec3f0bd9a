"""Reading only what was committed: the files of an output folder that a commit names, nothing else.

A folder rmqs or Spark writes into can hold files no run committed: the objects of a Spark-free run
killed before its commit record (on an object store each object is complete, but the run is not),
a retried run's leftovers, and, under a Structured Streaming drain, the part files of a micro-batch
killed before Spark logged it (partial, or 0 bytes: pyarrow refuses to open those). A reader that
lists the folder (a pyarrow dataset, DuckDB's `read_parquet('.../*.parquet')`, a Trino or Hive
external table) counts all of them. The commits say which files are the output:

- rmqs's commit records, `<output>/_rmqs_commits/<token>.json` (`delivery.py`; a Dagster time
  window's in `<output>/rmqs_window=<key>/_rmqs_commits/`): written last by every exactly-once run
  (`run_consume` into a folder or `s3://`, `run_read` into files), each the manifest of its run's
  files;
- Spark's file sink log, `<output>/_spark_metadata/` (an AvailableNow drain, any streaming file
  sink): the files of every committed micro-batch (`spark/file_sink_log.py` has the format).

`committed_files` returns those files, `committed_dataset` a pyarrow dataset of them only (hand
`.files` to DuckDB, or the dataset to `duckdb.from_arrow`); a folder with neither holds no
committed run. Works on local folders and object stores (`objectstore.locate`: pyarrow or fsspec
file systems, `storage_options`). No pyspark, no broker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from pyspark_rmqs.runs.outputs import commit_index
from pyspark_rmqs.runs.outputs.delivery import COMMITS
from pyspark_rmqs.runs.outputs.objectstore import Location, locate

if TYPE_CHECKING:
    import pyarrow.dataset as pads

SPARK_LOG = "_spark_metadata"
WINDOW_PREFIX = "rmqs_window="  # a Dagster time window's folder (dagster_rmqs.windows)


def committed_files(
    output_path: str,
    *,
    filesystem: Any = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[str]:
    """Every file a commit under `output_path` names, as file system paths (sorted, each once).

    Paths are in the folder's file system: local paths, or `bucket/key` on an object store (give
    the same `filesystem` / `storage_options` to the reader, or use `committed_dataset`).
    """
    return _committed(locate(output_path, filesystem=filesystem, storage_options=storage_options))


def _committed(where: Location) -> list[str]:
    """Both kinds of commit, looked up at once where the folder is remote (each a round trip or
    more: the Spark log's listing costs no time beside the commit index's reads)."""
    if where.local:
        return sorted(set(_rmqs_files(where)) | set(_spark_files(where)))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmqs-spark-log") as pool:
        spark = pool.submit(_spark_files, where)
        rmqs = _rmqs_files(where)
        return sorted(set(rmqs) | set(spark.result()))


def committed_dataset(
    output_path: str,
    *,
    filesystem: Any = None,
    storage_options: Mapping[str, Any] | None = None,
    format: str = "parquet",
) -> pads.Dataset:
    """A pyarrow dataset of the committed files under `output_path` only (see `committed_files`).

    Hive-style folders below `output_path` read as columns, as a folder scan shows them (`rmqs_run`
    for the folders of Spark exactly-once runs, `partition_by` columns).
    """
    import pyarrow.dataset as ds

    where = locate(output_path, filesystem=filesystem, storage_options=storage_options)
    files = _committed(where)
    return ds.dataset(
        files, filesystem=where.fs, format=format, partitioning="hive", partition_base_dir=where.base
    )


def _rmqs_files(where: Location) -> list[str]:
    """The files the commit records (manifests) under `where` list: its own `_rmqs_commits/`, or,
    for a Dagster time-window output (which has none of its own), each window's
    (`rmqs_window=<key>/_rmqs_commits/`), read through their indexes (`commit_index`: one listing
    of record names and O(1) records per folder, whatever the history)."""
    from pyarrow import fs as pafs

    own = commit_index.snapshot(commit_index.ArrowFolder(where.fs, where.path(COMMITS)))
    if own.runs:  # a folder of runs: no time windows below it (no listing of its files)
        return [f"{where.base}/{f}" for f in own.files]
    out: list[str] = []
    selector = pafs.FileSelector(where.base, allow_not_found=True)
    for info in where.fs.get_file_info(selector):
        if info.type == pafs.FileType.Directory and info.base_name.startswith(WINDOW_PREFIX):
            window = commit_index.snapshot(commit_index.ArrowFolder(where.fs, f"{info.path}/{COMMITS}"))
            out += [f"{info.path}/{f}" for f in window.files]
    return out


def _spark_files(where: Location) -> list[str]:
    """The files Spark's file sink log under `where` holds after its last batch (none without a log)."""
    log = commit_index.ArrowFolder(where.fs, where.path(SPARK_LOG))  # one LIST, one GET a file
    names = set(log.list_names())
    batches = [int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit() and not n.endswith(".tmp")]
    if not batches:
        return []
    last = max(batches)
    compacts = [int(n.split(".")[0]) for n in names if n.endswith(".compact")]
    base = max((c for c in compacts if c <= last), default=-1)
    state: dict[str, None] = {}
    if base >= 0:
        _apply(state, _read_text(log, f"{base}.compact"))
    for batch in range(base + 1, last + 1):
        if str(batch) in names:
            _apply(state, _read_text(log, str(batch)))
    return [p for p in (_fs_path(where, uri) for uri in state) if p is not None]


def _read_text(log: commit_index.ArrowFolder, name: str) -> str:
    body = log.read_bytes(name)
    if body is None:  # listed, then gone: not an empty batch
        raise FileNotFoundError(f"{log.path}/{name}")
    return body.decode()


def _apply(state: dict[str, None], text: str) -> None:
    """One log file's actions (after its `v1` header): `add` puts a file in, `delete` takes it out."""
    for line in text.splitlines()[1:]:
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("action", "add") == "add":
            state[entry["path"]] = None
        else:
            state.pop(entry["path"], None)


def _fs_path(where: Location, uri: str) -> str | None:
    """A log entry's URI (`file:/...`, `s3a://bucket/key`, percent-encoded) as a path of `where.fs`."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if where.local else None
    if where.local:
        return None
    return f"{parsed.netloc}{unquote(parsed.path)}"
