"""A run's cost against its output's history: a watermark run after 1, 1,000 and 10,000 earlier runs.

    .venv/bin/python -m bench.history [--histories 1,1000,10000] [--runs 3] [--targets local,s3]

One stream; at each history size H the output folder holds what H earlier exactly-once runs of the
consumer wrote (one Parquet file and one commit record each, made directly, as the runs name them:
`consume.range_file_name`, `delivery.new_record`; through the index's compaction as the runs do),
and the consumer's watermark sits at their end. Then `--runs` real watermark runs
(`jobs.plan_read` + `consume.run_consume` into a `ParquetSink`, 10 new messages each) are timed,
after one untimed run at the first size (a process's first run pays its imports and connections),
and `committed_files` on the output. Targets: a local folder, and an S3 bucket on moto's server
(tests/support/s3.py, loopback). Prints, per target and size, the median run and reader time and
their ratio to the first size: `local, 10,000 earlier runs: run 57 ms (1.04x), committed_files 21 ms`.

moto's server answers a LIST by scanning every key of the bucket (S3 lists by prefix), so on moto a
run's one LIST grows with the data files beside the output, not with its commit records. With
`--pad` (the default on S3; `--no-pad` measures the bucket as the runs leave it), the bucket holds
as many keys at every size: unrelated empty objects under `pad/`, as many as the largest history
leaves, removed as the history grows. The ratio is then what the history costs a run, the bucket's
size held still, as S3's listing by prefix holds it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import connection, fill, temp_stream
from pyspark_rmqs import jobs
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.runs import consume
from pyspark_rmqs.runs.outputs.committed import committed_files
from pyspark_rmqs.runs.outputs.delivery import RunToken, StoreCommits

PER_RUN = 10  # messages each run reads


def _history(sink: consume.ParquetSink, consumer: str, stream: str, have: int, want: int) -> None:
    """Extend the output's history from `have` to `want` runs, as those runs would have written it."""
    commits = sink.commits()
    if sink.location.local:
        sink.fs.create_dir(sink.base, recursive=True)
    else:  # on moto a run's objects take ~0.3 s one after the other: written 16 at a time instead
        _history_remote(sink, consumer, stream, have, want)
        return
    for i in range(have, want):
        start, end = i * PER_RUN, (i + 1) * PER_RUN
        token = RunToken(consumer, {stream: (start, end)})
        name = consume.range_file_name(stream, start, end, token)
        _empty(sink.fs, sink.location.path(name))  # the reader lists it; its content is not measured
        commits.commit(token, [name], PER_RUN, 0)


def _history_remote(sink: consume.ParquetSink, consumer: str, stream: str, have: int, want: int) -> None:
    """The same objects as `_history`, put 16 at a time, then compacted as the runs' compactions
    leave them: one index object, the records archived."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import asdict

    from pyspark_rmqs.runs.outputs import commit_index
    from pyspark_rmqs.runs.outputs.delivery import new_record

    def one(i: int) -> None:
        start, end = i * PER_RUN, (i + 1) * PER_RUN
        token = RunToken(consumer, {stream: (start, end)})
        name = consume.range_file_name(stream, start, end, token)
        _empty(sink.fs, sink.location.path(name))
        record = new_record(token, [name], PER_RUN, 0)
        folder.write_bytes(f"{token.value}.json", json.dumps(asdict(record), indent=1).encode())

    commits = sink.commits()
    assert isinstance(commits, StoreCommits)
    folder = commits.folder()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, range(have, want)))
    commit_index.compact(folder, every=commit_index.COMPACT_EVERY)


def _run(conn: Any, stream: str, consumer: str, output: str, options: dict[str, Any] | None) -> float:
    t0 = time.perf_counter()
    plan = jobs.plan_read(conn, stream=stream, consumer=consumer, max_messages=PER_RUN)
    sink = consume.ParquetSink(output, storage_options=options)
    summary = consume.run_consume(conn, plan, sink, metadata_fields="")
    took = time.perf_counter() - t0
    assert summary.rows == PER_RUN, summary.rows
    return took


def _target(kind: str, tmp: str, s3: Any) -> tuple[str, dict[str, Any] | None]:
    if kind == "local":
        return f"{tmp}/{uuid.uuid4().hex[:8]}", None
    return f"s3://{s3.new_bucket('bench-history')}/out", s3.storage_options()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--histories", default="1,1000,10000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--targets", default="local,s3")
    ap.add_argument("--pad", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    sizes = [int(x) for x in args.histories.split(",")]
    targets = args.targets.split(",")
    conn = connection()
    s3 = None
    if "s3" in targets:
        from tests.support import s3 as ts3

        s3 = ts3.start()
    try:
        with temp_stream(conn, "bench-history") as stream, tempfile.TemporaryDirectory() as tmp:
            total = (max(sizes) + (args.runs + 1) * len(sizes)) * PER_RUN + PER_RUN
            fill(conn, stream, total)
            for kind in targets:
                _one_target(conn, stream, kind, tmp, s3, sizes, args.runs, args.pad)
    finally:
        if s3 is not None and s3.process is not None:
            ts3.stop(s3.process)


def _one_target(
    conn: Any, stream: str, kind: str, tmp: str, s3: Any, sizes: list[int], runs: int, pad: bool
) -> None:
    output, options = _target(kind, tmp, s3)
    consumer = f"bench-history-{uuid.uuid4().hex[:8]}"
    sink = consume.ParquetSink(output, storage_options=options)
    client = BrokerClient(conn)
    pads = _Pad(sink, 2 * (max(sizes) + runs * len(sizes) + 1)) if pad and kind == "s3" else None
    have = 0
    first: dict[str, float] = {}
    for i, size in enumerate(sizes):
        _history(sink, consumer, stream, have, size)
        if pads is not None:
            pads.keep(_bucket_keys(sink))
        have = size
        client.store_offsets(consumer, {stream: have * PER_RUN - 1})
        if i == 0:  # untimed: the process's first run pays its imports and connections
            _run(conn, stream, consumer, output, options)
            have += 1
        client.store_offsets(consumer, {stream: have * PER_RUN - 1})
        took = [_run(conn, stream, consumer, output, options) for _ in range(runs)]
        have += runs  # the timed runs are history too; the next size continues after them
        reader = _time(lambda: committed_files(output, storage_options=options), runs)
        run_s, read_s = statistics.median(took), reader
        first.setdefault("run", run_s)
        first.setdefault("read", read_s)
        where = f"{kind} (bucket padded to {pads.total:,} keys)" if pads is not None else kind
        print(
            f"{where}, {size:,} earlier runs: run {run_s * 1000:.0f} ms ({run_s / first['run']:.2f}x), "
            f"committed_files {read_s * 1000:.0f} ms ({read_s / first['read']:.2f}x)",
            flush=True,
        )


class _Pad:
    """Unrelated empty objects beside the output (`<bucket>/pad/`), keeping the bucket at `total` keys."""

    def __init__(self, sink: consume.ParquetSink, total: int) -> None:
        self.fs, self.total = sink.fs, total
        self.root = sink.location.base.split("/", 1)[0] + "/pad"
        self.names: list[str] = []

    def keep(self, others: int) -> None:
        """Add or remove pads so that the bucket holds `total` keys, `others` of them not pads."""
        from concurrent.futures import ThreadPoolExecutor

        want = max(0, self.total - others)
        with ThreadPoolExecutor(max_workers=16) as pool:
            if want > len(self.names):
                new = [f"{self.root}/{i:08d}" for i in range(len(self.names), want)]
                list(pool.map(lambda path: _empty(self.fs, path), new))
                self.names += new
            else:
                list(pool.map(self.fs.delete_file, self.names[want:]))
                del self.names[want:]


def _empty(fs: Any, path: str) -> None:
    """An empty object at `path`: a data file of the history, or a pad."""
    with fs.open_output_stream(path) as f:
        f.write(b"")


def _bucket_keys(sink: consume.ParquetSink) -> int:
    """The keys under the output (data files, commit records, index), recursively."""
    from pyarrow import fs as pafs

    infos = sink.fs.get_file_info(pafs.FileSelector(sink.location.base, recursive=True))
    return sum(1 for i in infos if i.type == pafs.FileType.File)


def _time(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    main()
