"""What each reader of an output folder sees after a run died before its commit
(docs/failure-semantics.md, "What each reader sees"): readers that follow the commits (Spark's
`_spark_metadata`, rmqs's manifests through `committed_files`) see every offset once; a folder scan
(a pyarrow dataset, DuckDB's `*.parquet`, an external table) sees what the commits do not name.

Each test counts (stream, offset) pairs as each reader sees them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs import consume, jobs
from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.cli.watermark import apply_move, plan_move
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.runs.outputs.committed import committed_dataset, committed_files
from pyspark_rmqs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.e2e.faults.support import killed_consume_job
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.broker]


def _counts(table: pa.Table) -> Counter[tuple[str, int]]:
    return Counter(zip(table.column("stream").to_pylist(), table.column("offset").to_pylist(), strict=True))


def folder_scan(out: Path) -> Counter[tuple[str, int]]:
    """What a reader listing the folder sees: every Parquet file not `_`- or `.`-prefixed."""
    return _counts(ds.dataset(str(out), format="parquet").to_table(columns=["stream", "offset"]))


def through_commits(out: Path) -> Counter[tuple[str, int]]:
    """What a reader of `committed_files` sees (the manifests, or Spark's sink log)."""
    if not committed_files(str(out)):  # no committed file: an empty dataset has no columns
        return Counter()
    return _counts(committed_dataset(str(out)).to_table(columns=["stream", "offset"]))


def messages(broker: BrokerSettings, stream: str) -> list[int]:
    """The offsets of the messages in `stream` (offset-tracking entries take offsets too)."""
    c = client(broker)
    return [
        int(o) for o in read_range(conn_of(broker), stream, 0, c.tail(stream)).column("offset").to_pylist()
    ]


def offsets(stream: str, start: int, end: int) -> Counter[tuple[str, int]]:
    return Counter((stream, o) for o in range(start, end))


def test_a_folder_scan_of_a_consume_output_sees_uncommitted_files_and_what_an_abandoned_run_left(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """A Spark-free consume run into a folder (a super stream of 2 partitions of 300), SIGKILLed with
    partition 0's file in place and nothing committed: a folder scan sees those 300 offsets, the
    commits none. Its retry rewrites the same names: both readers see every offset once. A later run
    (100 more per partition) killed likewise and abandoned for good (`rmqs watermark set` to 349),
    then the next run reads from 350: the commits name every offset read once; the folder scan also
    shows the abandoned file (partition 0's 100 new messages), so those from 350 on twice. Deleting
    the files `committed_files` does not name leaves the folder scan equal to the commits. (The
    runs' offset-tracking entries take offsets too: the 100 new messages follow them.)"""
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(300)])
    conn = conn_of(broker)
    out = tmp_path / "out"
    cfg = {**broker.spark_options, "superstream": name, "consumer": "scan", "out": str(out), "kill": "sink"}
    killed_consume_job(cfg)
    assert folder_scan(out) == offsets(parts[0], 0, 300), "the killed run's completed file is not visible"
    assert committed_files(str(out)) == [] and through_commits(out) == Counter()

    consume.run_consume(
        conn, jobs.plan_read(conn, superstream=name, consumer="scan"), consume.ParquetSink(str(out))
    )
    everything = offsets(parts[0], 0, 300) + offsets(parts[1], 0, 300)
    assert folder_scan(out) == everything, "the retry did not rewrite the killed run's file"
    assert through_commits(out) == everything

    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(300, 400)])
    killed_consume_job(cfg)  # plans the 100 new messages per partition; partition 0's file is in place
    apply_move(conn, plan_move(conn, "scan", json.dumps(dict.fromkeys(parts, 350)), Target.of(None, name)))
    nxt = jobs.plan_read(conn, superstream=name, consumer="scan")
    assert not nxt.resumed and {p: r[0] for p, r in nxt.ranges.items()} == dict.fromkeys(parts, 350)
    consume.run_consume(conn, nxt, consume.ParquetSink(str(out)))
    # The second 100 of each partition follow the runs' offset-tracking entries (not at 300..399).
    later = {p: [o for o in messages(broker, p) if o >= 300] for p in parts}
    assert [len(v) for v in later.values()] == [100, 100]
    read = everything + Counter((p, o) for p in parts for o in later[p] if o >= 350)
    assert through_commits(out) == read and max(read.values()) == 1
    abandoned = Counter((parts[0], o) for o in later[parts[0]])  # partition 0's file of the killed run
    assert folder_scan(out) == read + abandoned, "the abandoned run's file is not as documented"
    assert max((read + abandoned).values()) == 2

    named = set(committed_files(str(out)))
    for f in out.glob("*.parquet"):
        if str(f) not in named:
            f.unlink()
    assert folder_scan(out) == through_commits(out) == read


@pytest.mark.spark
def test_spark_and_the_commits_follow_a_drains_sink_log_where_a_folder_scan_sees_a_replayed_batch_twice(
    spark: SparkSession, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """An AvailableNow drain (`jobs.run_drain`, 600 offsets in three micro-batches of 200) left as a
    process killed after batch 2's part files and before its log entry leaves it: the batch's entry
    in the sink log (`_spark_metadata/2`) and its checkpoint commit removed (a real kill of the whole
    application is tests/e2e/faults/test_killed_processes.py). The drain run again replays batch 2 into
    new part files. Spark's reader (`spark.read.parquet`, which honours `_spark_metadata`) and
    `committed_dataset` see every offset once; a folder scan sees batch 2's 200 offsets twice, and
    with a 0-byte part file (a writer killed before its first byte) it fails to read at all."""
    s = streams.stream("drain-readers")
    n = 600
    publish(broker, s, [b"d%04d" % i for i in range(n)])
    conn = conn_of(broker)
    out, ck = tmp_path / "out", tmp_path / "ck"

    def drain() -> jobs.RunSummary:
        return jobs.run_drain(
            spark,
            conn,
            stream=s,
            consumer="readers",
            checkpoint=str(ck),
            output_path=str(out),
            source_options={"maxRecordsPerTrigger": "200", "metadataFields": ""},
            timeout_s=120,
        )

    assert drain().batches == 3
    logged = [
        json.loads(line)["path"] for line in (out / "_spark_metadata" / "2").read_text().splitlines()[1:]
    ]
    assert logged, "batch 2 wrote no part file"
    for entry in (out / "_spark_metadata", ck / "commits"):  # the entry and its checksum file
        (entry / "2").unlink(missing_ok=True)
        (entry / ".2.crc").unlink(missing_ok=True)
    replay = drain()
    assert replay.rows == 200 and replay.watermark_stored

    once = offsets(s, 0, n)
    spark_sees = Counter((r.stream, int(r.offset)) for r in spark.read.parquet(str(out)).collect())
    assert spark_sees == once, "Spark read part files the sink log does not name"
    assert through_commits(out) == once
    assert folder_scan(out) == once + offsets(s, 400, 600), (
        "a folder scan did not see the replayed batch twice"
    )
    assert watermarks(conn, "readers", stream=s).partitions[0].stored == n - 1

    (out / "part-00000-00000000-0000-0000-0000-000000000000-c000.snappy.parquet").touch()
    with pytest.raises(pa.ArrowInvalid):
        folder_scan(out)
    spark_sees = Counter((r.stream, int(r.offset)) for r in spark.read.parquet(str(out)).collect())
    assert spark_sees == once and through_commits(out) == once
