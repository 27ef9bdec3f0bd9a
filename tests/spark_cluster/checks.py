"""Counting checks of the Spark cluster tier: every offset once, read back from the output or the
broker; which executor ran which task attempt (the driver's REST API); a paced sink that keeps a
task running long enough for a fault to hit it.

Counts are per (stream, offset), not rows: a row count hides a duplicate offset that makes up for a
lost one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.runs.spark_io import FileOutput
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import client, conn_of


def assert_each_offset_once(pairs: Iterable[tuple[str, int]], expected: Iterable[tuple[str, int]]) -> None:
    """Every expected (stream, offset) exactly once in `pairs`, and nothing else."""
    counts = Counter(pairs)
    dups = {k: n for k, n in counts.items() if n > 1}
    assert not dups, f"{len(dups)} offset(s) more than once, e.g. {sorted(dups.items())[:5]}"
    want = set(expected)
    missing, extra = sorted(want - set(counts)), sorted(set(counts) - want)
    assert not missing, f"{len(missing)} offset(s) missing, e.g. {missing[:5]}"
    assert not extra, f"{len(extra)} offset(s) not in the ranges, e.g. {extra[:5]}"


def message_offsets(b: BrokerSettings, streams: Iterable[str]) -> set[tuple[str, int]]:
    """(stream, offset) of every message the streams hold now, read from the broker.

    Not `range(tail)`: a consumer's stored offset is written into the stream as a tracking chunk,
    which takes offsets too (each store of a watermark moves the tail past the messages)."""
    return {(s, o) for s in streams for o, _ in stored(b, s)}


def last_offsets(b: BrokerSettings, streams: Iterable[str]) -> dict[str, int]:
    """The offset of each stream's last message: what a consumer that read it all has stored."""
    return {s: max(o for o, _ in stored(b, s)) for s in streams}


def stored(b: BrokerSettings, stream: str) -> list[tuple[int, bytes]]:
    """(offset, body) of every message `stream` holds, from offset 0 to its tail."""
    table = read_range(conn_of(b), stream, 0, client(b).tail(stream))
    return list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True))


def duplicates(b: BrokerSettings, stream: str, expected: list[bytes]) -> int:
    """How many messages of `stream` repeat a body; fails if any expected body is missing or any
    offset is skipped or repeated (a write may duplicate, where no dedup is promised, never lose)."""
    got = stored(b, stream)
    offsets = [o for o, _ in got]
    assert offsets == list(range(len(got))), f"{stream}: offsets are not 0..{len(got) - 1}"
    bodies = Counter(v for _, v in got)
    missing = set(expected) - set(bodies)
    assert not missing, (
        f"{stream}: {len(missing)} of {len(expected)} rows missing, e.g. {sorted(missing)[:3]}"
    )
    unexpected = set(bodies) - set(expected)
    assert not unexpected, f"{stream}: {len(unexpected)} messages nobody wrote, e.g. {sorted(unexpected)[:3]}"
    return len(got) - len(bodies)


def assert_written_once(b: BrokerSettings, stream: str, expected: list[bytes]) -> None:
    """The stream holds exactly `expected`, each body at one offset, offsets 0..n-1."""
    dups = duplicates(b, stream, expected)
    assert dups == 0, f"{stream}: {dups} duplicated message(s) for {len(expected)} rows"
    assert client(b).tail(stream) == len(expected)


def output_pairs(out: Path) -> list[tuple[str, int]]:
    """(stream, offset) of every row a Parquet reader sees under `out` (staged and `_` files aside)."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(columns=["stream", "offset"])
    return list(zip(table.column("stream").to_pylist(), table.column("offset").to_pylist(), strict=True))


def paced(rows: int, delay_s: float) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function passing `rows` rows per `delay_s`: a task that runs long enough for a
    fault to hit it mid-read (the data alone is read in well under a second)."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time as t

        for batch in batches:
            for i in range(0, batch.num_rows, rows):
                t.sleep(delay_s)
                yield batch.slice(i, rows)

    return fn


@dataclass(frozen=True)
class PacedOutput(FileOutput):
    """An exactly-once Parquet output (`jobs.write_output`'s) whose writing tasks are paced: the
    watermark run's own read is what the fault interrupts, and its commit is the real one."""

    rows: int = 200
    delay_s: float = 0.25

    def write_to(self, df: Any, path: str, mode: str) -> None:
        super().write_to(df.mapInArrow(paced(self.rows, self.delay_s), df.schema), path, mode)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=20) as r:
        return json.loads(r.read())


def task_attempts(ui: str) -> list[dict[str, Any]]:
    """Every task attempt of the driver's application: stage, index, attempt, executor, status."""
    (app,) = _get(f"{ui}/api/v1/applications")
    found = []
    for stage in _get(f"{ui}/api/v1/applications/{app['id']}/stages?details=true"):
        for task in (stage.get("tasks") or {}).values():
            found.append({"stage": stage["stageId"], **task})
    return found


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def run_job(
    args: list[str], timeout_s: float = 900.0, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`python -m tests.spark_cluster.jobs <args>` (a Spark driver of its own); its last stdout line,
    `RESULT {json}`, parsed. A driver per process: one with a `spark://` master cannot share a
    process with another session, and each orchestrator runs its task in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark_cluster.jobs", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=None if env is None else {**os.environ, **env},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"job {args[0]} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return dict(json.loads(lines[-1][len("RESULT ") :]))
