"""Spark writes the deduplication fault tests run in a process of their own.

    python -m tests.e2e.faults.write_job retry CONFIG_JSON
    python -m tests.e2e.faults.write_job stream CONFIG_JSON

`retry` writes `rows` numbered 1,000-byte rows in 2 partitions with `producerName` under `local[2,4]` (task
retries allowed, as on a cluster); partition 0's first attempt stops after half its rows, once the
broker holds `wait_tail` messages (creating `stored`), by raising: its retry re-publishes the whole
partition. Prints the number of failed task attempts.
`stream` runs a streaming query from the `source` stream to the `target` stream with `producerName`.
In epoch `pause_epoch`, partition 0 passes half its rows, waits until the broker holds `pause_at`
messages in `target` (the sink sent them; the epoch is not committed), creates `paused` and
sleeps until the test kills the process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from tests.e2e.faults.spark_job import session


def _tail(options: dict[str, str], stream: str) -> int:
    from pyspark_rmqs.broker.client import BrokerClient
    from pyspark_rmqs.options import parse_connection_options

    return int(BrokerClient(parse_connection_options(options)).tail(stream))


def _wait_for_tail(options: dict[str, str], stream: str, at_least: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while _tail(options, stream) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"'{stream}' never reached {at_least} messages")
        time.sleep(0.05)


def small_batches(spark: Any) -> Any:
    """Arrow batches of 100 rows between the Python stages, so rows passed on reach the sink soon
    (with the default 10,000 they would wait in the JVM for the rest of the batch). A Python worker
    still buffers up to 64 KiB of its output: callers wait for a part of what they passed on."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    return spark


def fail_first_attempt(
    options: dict[str, str], target: str, wait_tail: int, stored: str
) -> Callable[..., Any]:
    """mapInArrow: partition 0, attempt 0 passes half its rows, waits for the broker, then fails."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pathlib

        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        rows = pa.Table.from_batches(list(batches))
        if ctx.partitionId() != 0 or ctx.attemptNumber() > 0:
            yield from rows.to_batches()
            return
        half = rows.num_rows // 2
        yield from rows.slice(0, half).to_batches(max_chunksize=100)
        _wait_for_tail(options, target, wait_tail)  # the sink published them and the broker stored them
        pathlib.Path(stored).touch()
        raise RuntimeError("injected failure of the first attempt after half its rows were stored")

    return fn


def retry(cfg: dict[str, Any]) -> None:
    spark = small_batches(session("local[2,4]"))  # up to 4 attempts per task
    n = cfg["rows"]
    df = spark.range(0, n, 1, 2).selectExpr("rpad(format_string('r%07d', id), 1000, '.') as value")
    failing = df.mapInArrow(
        fail_first_attempt(cfg["options"], cfg["target"], cfg["wait_tail"], cfg["stored"]), df.schema
    )
    spark.sparkContext.setJobGroup("write", "the write under test")
    (
        failing.write.format("rabbitmq_streams")
        .options(**cfg["options"])
        .option("stream", cfg["target"])
        .option("producerName", "retried")
        .mode("append")
        .save()
    )
    print(json.dumps({"failed_tasks": _failed_tasks(spark, "write")}), flush=True)
    spark.stop()


def _failed_tasks(spark: Any, group: str) -> int:
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else []:
            st = tracker.getStageInfo(stage)
            failed += st.numFailedTasks if st else 0
    return failed


def pause_in_epoch(cfg: dict[str, Any]) -> Callable[..., Any]:
    """mapInArrow: in epoch `pause_epoch`, partition 0 passes half its rows and then never ends."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pathlib

        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        rows = pa.Table.from_batches(list(batches))
        epoch = ctx.getLocalProperty("streaming.sql.batchId")
        if ctx.partitionId() != 0 or epoch is None or int(epoch) != cfg["pause_epoch"]:
            yield from rows.to_batches()
            return
        yield from rows.slice(0, rows.num_rows // 2).to_batches(max_chunksize=100)
        _wait_for_tail(cfg["options"], cfg["target"], cfg["pause_at"])
        pathlib.Path(cfg["paused"]).touch()
        time.sleep(600)  # killed here: the sink sent part of the epoch, the epoch is not committed

    return fn


def stream(cfg: dict[str, Any]) -> None:
    spark = small_batches(session("local[2]"))
    df = (
        spark.readStream.format("rabbitmq_streams")
        .options(**cfg["options"])
        .option("stream", cfg["source"])
        .option("maxRecordsPerTrigger", str(cfg["per_epoch"]))
        .option("minPartitions", "2")
        .option("metadataFields", "")
        .load()
        .select("value")
    )
    q = (
        df.mapInArrow(pause_in_epoch(cfg), df.schema)
        .writeStream.format("rabbitmq_streams")
        .options(**cfg["options"])
        .option("stream", cfg["target"])
        .option("producerName", "replayed")
        .option("checkpointLocation", cfg["ckpt"])
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    q.awaitTermination()  # until the test kills this process


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    mode, config = sys.argv[1], json.loads(sys.argv[2])
    {"retry": retry, "stream": stream}[mode](config)
