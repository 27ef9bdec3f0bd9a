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
import logging
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.runs.outputs.delivery import local_path
from pyspark_rmqs.runs.outputs.objectstore import locate

log = logging.getLogger(__name__)
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


def check_sink_log_is_this_querys(checkpoint: str, output_path: str) -> None:
    """Refuse a drain whose output folder holds the file sink log of a query this checkpoint is not.

    Spark's file sink skips a micro-batch whose id its log (`<output>/_spark_metadata`) already holds:
    that is how a batch replayed after a crash commits once. A query on a new (or deleted and
    re-created) checkpoint numbers its batches from 0 again, so into a folder another checkpoint
    wrote, its first batches are "already committed": read, not written, and the source stores
    their offsets all the same. The consumer's watermark moves past messages that are in no file,
    with lag 0 and no error (found by counting: 50 of 50 new messages dropped). A checkpoint that
    wrote the log has planned every batch in it (the offsets log is written before a batch runs),
    so a log ahead of the checkpoint's offsets log belongs to another query: refused here, before
    anything is read, naming both options.

    Listed with pyarrow (Spark's own file index hides `_spark_metadata`), so where rmqs cannot
    open a folder (a scheme pyarrow does not know, such as `s3a://` or `dbfs:`, or no credentials
    here) the check is skipped with a warning rather than failing a drain Spark could run.
    """
    try:
        logged = _batch_ids(f"{output_path.rstrip('/')}/{LOG_DIR}")
        planned = _batch_ids(f"{checkpoint.rstrip('/')}/offsets") if logged else []
    except (ConfigurationError, OSError) as e:
        log.warning(
            "could not list the drain's output or checkpoint to check that the output's file sink log "
            "is this checkpoint's (%s); a new checkpoint into a folder another one wrote loses its "
            "first batches",
            type(e).__name__,
        )
        return
    if not logged or max(planned, default=-1) >= max(logged):
        return
    raise ConfigurationError(
        f"output_path '{output_path}' holds the file sink log of another streaming query (batches up to "
        f"{max(logged)}), and checkpoint_location '{checkpoint}' has "
        + (f"planned only up to batch {max(planned)}" if planned else "never run")
        + ": Spark would skip this drain's first batches as already committed, and their messages would "
        "be in no file while the watermark moved past them. Nothing was read. Give the checkpoint that "
        "wrote this folder, or a new output_path for the new checkpoint"
    )


def _batch_ids(folder: str) -> list[int]:
    """The micro-batch ids the files of a streaming log folder name (`7`, `9.compact`); [] when the
    folder does not exist."""
    from pyarrow import fs as pafs

    where = locate(folder)
    found = where.fs.get_file_info(pafs.FileSelector(where.base, allow_not_found=True))
    names = (info.base_name.split(".", 1)[0] for info in found if info.type == pafs.FileType.File)
    return [int(n) for n in names if n.isdigit()]
