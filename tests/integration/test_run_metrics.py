"""The standard run metrics are measured: fetch, decode, flush and commit time of real reads.

`fetch_ms` (subscribing, waiting for and receiving chunks) and `decode_ms` (chunks into Arrow) are
the readers' own clocks (`RangeReader.fetch_s`, `decode_s`). A Spark run sums them over its tasks
through an accumulator; with one task (one stream, one split), as here, the sum is that task's time
and cannot exceed the run's wall time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.core.batches import BatchBuilder
from pyspark_rmqs.jobs import (
    ExecutorReadMetrics,
    RunSummary,
    plan_read,
    run_drain,
    run_read,
    write_output,
)
from pyspark_rmqs.runs.consume import ParquetSink, run_consume
from tests.support.broker import BrokerSettings
from tests.support.data import conn_of, publish

pytestmark = [pytest.mark.broker]

N = 5000
BODY = 206  # bytes per message body of `filled`


@pytest.fixture
def filled(broker: BrokerSettings, streams) -> str:  # type: ignore[no-untyped-def]
    s = streams.stream("metrics")
    publish(broker, s, [b"m%05d" % i + b"." * 200 for i in range(N)], batch=250)
    return s


def assert_measured(summary: RunSummary, *, rows: int = N) -> None:
    d = summary.to_dict()
    for k in ("fetch_ms", "decode_ms", "flush_ms"):
        assert isinstance(d[k], float) and d[k] > 0, (k, d[k])
    assert summary.rows == rows
    # Measured inside the run, one reader at a time: together they fit in the run's wall time.
    assert d["fetch_ms"] + d["decode_ms"] <= summary.seconds * 1000, d


def test_range_reader_measures_fetch_and_decode_within_its_wall_time(
    broker: BrokerSettings, filled: str
) -> None:
    reader = RangeReader(conn_of(broker), filled, 0, N, ReadSettings(batch_rows=1000))
    t0 = time.perf_counter()
    rows = batches = 0
    for batch in reader:
        rows += batch.num_rows
        batches += 1
        time.sleep(0.01)  # the caller's time between batches is neither fetch nor decode
    wall = time.perf_counter() - t0
    assert rows == N == reader.rows
    assert reader.fetch_s > 0 and reader.decode_s > 0
    assert reader.fetch_s + reader.decode_s <= wall - 0.01 * batches


def test_decode_is_the_chunk_and_batch_work_and_fetch_is_not(
    broker: BrokerSettings,
    streams,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Slow the per-chunk and the per-batch Arrow work down: decode holds both, fetch neither."""
    s = streams.stream("chunks")
    for i in range(10):  # ten confirmed publishes of 500: at least ten chunks, at most 500 messages each
        publish(broker, s, [b"c%05d" % (i * 500 + j) for j in range(500)])
    per_chunk, per_batch = 0.02, 0.1
    add_chunk, flush = BatchBuilder.add_chunk, BatchBuilder.flush

    def slow_add_chunk(self: BatchBuilder, *a: Any) -> None:
        time.sleep(per_chunk)
        add_chunk(self, *a)

    def slow_flush(self: BatchBuilder) -> pa.RecordBatch | None:
        time.sleep(per_batch)
        return flush(self)

    monkeypatch.setattr(BatchBuilder, "add_chunk", slow_add_chunk)
    monkeypatch.setattr(BatchBuilder, "flush", slow_flush)
    reader = RangeReader(conn_of(broker), s, 0, N, ReadSettings(batch_rows=1000))
    batches = sum(1 for _ in reader)
    in_chunks, in_batches = per_chunk * reader.chunks, per_batch * batches
    assert reader.chunks >= 10 and batches >= 5, (reader.chunks, batches)
    assert reader.decode_s >= in_chunks + in_batches
    assert reader.fetch_s < min(in_chunks, in_batches)


def test_consume_run_measures_fetch_decode_flush_and_commit(
    broker: BrokerSettings, filled: str, tmp_path: Path
) -> None:
    conn = conn_of(broker)
    plan = plan_read(conn, stream=filled, consumer="metrics")
    summary = run_consume(
        conn, plan, ParquetSink(str(tmp_path / "out")), source_options={"metadataFields": ""}
    )
    assert_measured(summary)
    assert summary.commit_ms is not None and summary.commit_ms > 0
    assert summary.batches is not None and summary.batches >= 1
    line = summary.to_dict()
    assert line["fetch_ms"] + line["decode_ms"] + line["flush_ms"] <= summary.seconds * 1000


def test_consume_into_a_function_measures_fetch_and_decode(broker: BrokerSettings, filled: str) -> None:
    conn = conn_of(broker)
    seen: list[pa.RecordBatch] = []
    summary = run_consume(conn, plan_read(conn, stream=filled, start="earliest"), seen.append)
    assert_measured(summary)
    assert sum(b.num_rows for b in seen) == N


@pytest.mark.spark
@pytest.mark.parametrize("exactly_once", [True, False], ids=["file_output", "callable_sink"])
def test_spark_read_brings_the_executors_fetch_and_decode_back(
    spark: SparkSession, broker: BrokerSettings, filled: str, tmp_path: Path, exactly_once: bool
) -> None:
    conn = conn_of(broker)
    plan = plan_read(conn, stream=filled, consumer=f"metrics-{exactly_once}")

    def sink(df: DataFrame) -> None:
        df.write.parquet(str(tmp_path / "plain"))

    out = write_output(str(tmp_path / "eo")) if exactly_once else sink
    summary = run_read(spark, conn, plan, out, metadata_fields="")
    assert_measured(summary)
    # The local property is gone after the run: later jobs of this thread report to nobody.
    from pyspark_rmqs.spark.common import METRICS_PROPERTY

    assert spark.sparkContext.getLocalProperty(METRICS_PROPERTY) is None


@pytest.mark.spark
def test_available_now_drain_brings_the_executors_fetch_and_decode_back(
    spark: SparkSession, broker: BrokerSettings, filled: str, tmp_path: Path
) -> None:
    def drain() -> RunSummary:
        return run_drain(
            spark,
            conn_of(broker),
            stream=filled,
            consumer="metrics-drain",
            checkpoint=str(tmp_path / "ck"),
            output_path=str(tmp_path / "o"),
            source_options={"metadataFields": "", "maxRecordsPerTrigger": "2000"},
            pipeline="dag/drain",
            retry_count=2,
        )

    def part_files() -> dict[str, int]:
        return {p.name: p.stat().st_size for p in (tmp_path / "o").glob("part-*.parquet")}

    summary = drain()
    assert summary.rows == N and summary.bytes == N * BODY
    # What the file sink committed, from its own log: every row once, the files' sizes.
    assert summary.records_written == N
    assert summary.bytes_written == sum(part_files().values()) > 0
    assert (summary.pipeline, summary.retry_count) == ("dag/drain", 2)
    assert summary.fetch_ms is not None and summary.fetch_ms > 0
    assert summary.decode_ms is not None and summary.decode_ms > 0
    assert summary.fetch_ms + summary.decode_ms <= summary.seconds * 1000
    assert summary.batches is not None and summary.batches >= 1
    assert summary.delivery == "exactly_once"
    assert summary.commit_ms is not None and summary.commit_ms > 0
    # The sink's Spark actions, as Spark timed them: within the run, and holding the tasks' decoding.
    assert summary.flush_ms is not None and summary.decode_ms <= summary.flush_ms <= summary.seconds * 1000

    # The next drain counts only what it wrote, not the files of the earlier run.
    files_before = part_files()
    publish(broker, filled, [b"n%05d" % i + b"." * 200 for i in range(700)], batch=250)
    again = drain()
    new_files = {k: v for k, v in part_files().items() if k not in files_before}
    assert (again.rows, again.records_written, again.bytes) == (700, 700, 700 * BODY)
    assert again.bytes_written == sum(new_files.values()) > 0


def test_without_a_spark_context_the_executor_metrics_stay_null() -> None:
    """Spark Connect has no SparkContext (no accumulators): the fields stay None, the run goes on."""

    class ConnectLike:
        @property
        def sparkContext(self) -> Any:
            raise AttributeError("JVM_ATTRIBUTE_NOT_SUPPORTED")

    summary = RunSummary("s", {"s": 0}, {"s": 1})
    with ExecutorReadMetrics(ConnectLike()) as metrics:  # type: ignore[arg-type]
        pass
    metrics.fill(summary)
    assert (summary.fetch_ms, summary.decode_ms) == (None, None)
