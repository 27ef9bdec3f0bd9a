"""What a drain wrote, from Spark's file sink log: deltas, compactions, other runs' files excluded."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_rmqs.runs.outputs.file_sink_log import LOG_DIR, uri_path, written


def _part(out: Path, batch: int, rows: int) -> tuple[str, int]:
    f = out / f"part-{batch:05d}.parquet"
    pq.write_table(pa.table({"offset": list(range(rows))}), f)
    return f.as_uri(), f.stat().st_size


def _log(out: Path, name: str, files: list[tuple[str, int]]) -> None:
    lines = ["v1"] + [json.dumps({"path": p, "size": s, "isDir": False, "action": "add"}) for p, s in files]
    (out / LOG_DIR / name).write_text("\n".join(lines))


def _sink(tmp_path: Path, batches: int, compact_every: int = 10) -> dict[int, tuple[str, int]]:
    """A file sink's output after `batches` batches of (batch + 1) rows, compacted as Spark does."""
    (tmp_path / LOG_DIR).mkdir()
    files = {b: _part(tmp_path, b, b + 1) for b in range(batches)}
    for b in range(batches):
        if (b + 1) % compact_every == 0:  # Spark writes <b>.compact (all files so far) instead of <b>
            _log(tmp_path, f"{b}.compact", [files[i] for i in range(b + 1)])
        else:
            _log(tmp_path, str(b), [files[b]])
    return files


def test_the_batches_of_a_run_and_nothing_else(tmp_path: Path) -> None:
    files = _sink(tmp_path, 13)  # deltas 0-8, 9.compact, deltas 10-12
    for first, last in [(0, 12), (10, 12), (8, 10), (9, 9), (3, 5), (12, 12)]:
        w = written(str(tmp_path), first, last, "parquet")
        assert w is not None
        batches = range(first, last + 1)
        assert w.files == len(batches)
        assert w.bytes == sum(files[b][1] for b in batches)
        assert w.rows == sum(b + 1 for b in batches), (first, last)


def test_no_rows_for_other_formats_and_none_without_a_log(tmp_path: Path) -> None:
    (tmp_path / "o").mkdir()
    _sink(tmp_path / "o", 2)
    w = written(str(tmp_path / "o"), 0, 1, "json")
    assert w is not None and (w.files, w.rows) == (2, None)
    assert written(str(tmp_path / "missing"), 0, 1, "parquet") is None
    assert written("s3a://bucket/out", 0, 1, "parquet") is None


def test_local_paths_from_uris() -> None:
    assert uri_path("file:///tmp/a%20b/x.parquet") == Path("/tmp/a b/x.parquet")
    assert uri_path("/tmp/x") == Path("/tmp/x")
    assert uri_path("s3a://bucket/x") is None
