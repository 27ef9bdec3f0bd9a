"""What Spark's file sink committed in given micro-batches, read from its own metadata log.

A Structured Streaming file sink reports no output rows (`numOutputRows` is -1), but it records
every file it commits in `<output>/_spark_metadata/<batchId>`: one JSON line per file with its path
and size, under a `v1` header. Every `spark.sql.streaming.fileSink.log.compactInterval` batches
(10 by default) a `<batchId>.compact` file holds all files committed so far instead. The files of
batches `first..last` are then the log's state after `last` minus its state before `first`.

This is how a drain measures `records_written` and `bytes_written` rather than assuming them:
sizes come from the log, row counts from the Parquet footers of those files (local paths only; a
remote file system would need its own client, so rows stay unknown there). No pyspark import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark_rmqs.runs.outputs.delivery import local_path

LOG_DIR = "_spark_metadata"


@dataclass(frozen=True)
class Written:
    """Files a file sink committed in some batches: their count, bytes and (Parquet, local) rows."""

    files: int
    bytes: int
    rows: int | None


def _entries(path: Path) -> dict[str, int]:
    """`{file path: size}` of one log file (added files; a delete action removes one)."""
    out: dict[str, int] = {}
    lines = path.read_text().splitlines()
    for line in lines[1:]:  # the first line is the log version ("v1")
        if not line.strip():
            continue
        e = json.loads(line)
        if e.get("action", "add") == "add":
            out[e["path"]] = int(e.get("size", 0))
        else:
            out.pop(e["path"], None)
    return out


def _state(log: Path, upto: int) -> dict[str, int]:
    """Every file committed in batches `0..upto`: the last compaction at or before it, then deltas."""
    if upto < 0:
        return {}
    compacts = [int(p.name.split(".")[0]) for p in log.glob("*.compact")]
    base = max((c for c in compacts if c <= upto), default=-1)
    state = _entries(log / f"{base}.compact") if base >= 0 else {}
    for b in range(base + 1, upto + 1):
        delta = log / str(b)
        if delta.exists():
            state.update(_entries(delta))
    return state


def uri_path(uri: str) -> Path | None:
    """The local path of a log entry's `file:` URI (percent-encoded, as Spark writes it; or a plain
    path); None for any other file system. The output folder itself is a user's path, not a URI:
    `delivery.local_path` reads it, as it does for the exactly-once commit's output."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    return None


def written(output_path: str, first_batch: int, last_batch: int, fmt: str) -> Written | None:
    """The files the sink at `output_path` committed in batches `first_batch..last_batch`.

    None when the output is not on a local file system or has no metadata log (not a file sink).
    """
    root = local_path(output_path)
    if root is None or not (root / LOG_DIR).is_dir():
        return None
    log = root / LOG_DIR
    before, after = _state(log, first_batch - 1), _state(log, last_batch)
    files = {p: size for p, size in after.items() if p not in before}
    rows: int | None = None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        paths = [uri_path(p) for p in files]
        if all(p is not None for p in paths):
            rows = sum(pq.read_metadata(str(p)).num_rows for p in paths if p is not None)
    return Written(len(files), sum(files.values()), rows)
