"""Spark jobs the fault tests run in a process of their own (to kill it, or to allow task retries).

    python -m tests.e2e.faults.spark_job read-kill-worker CONFIG_JSON
    python -m tests.e2e.faults.spark_job stream CONFIG_JSON

`read-kill-worker` reads a stream with task retries allowed (local[2,4]), kills the Spark Python
worker that is reading it (SIGKILL) once, and writes the rows it got to `out` as Parquet; it prints
how many task attempts failed.
`stream` runs a streaming query from `options` into Parquet at `out` with checkpoint `ckpt` until
killed, or until the data is drained when `available_now` is true.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def session(master: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    s = (
        SparkSession.builder.master(master)
        .appName("rmqs-faults")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    s.sparkContext.setLogLevel(os.environ.get("RMQS_FAULT_LOG_LEVEL", "ERROR"))
    return s


def paced(started: str):  # type: ignore[no-untyped-def]
    """Pass 2,000 rows per 0.1 s (the reader upstream is held back by it); touch `started` first."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pathlib
        import time

        for b in batches:
            for i in range(0, b.num_rows, 2000):
                pathlib.Path(started).touch()
                time.sleep(0.1)
                yield b.slice(i, 2000)

    return fn


def read_kill_worker(cfg: dict[str, Any]) -> None:
    from tests.e2e.faults.support import task_readers, wait_for

    spark = session("local[2,4]")  # up to 4 attempts per task, as on a cluster
    killed: list[int] = []

    def kill_one() -> None:
        wait_for(lambda: os.path.exists(cfg["started"]), 120, "the first rows")
        pid = wait_for(lambda: task_readers(cfg["port"]), 60, "a reading worker")[0]  # type: ignore[index]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    df = (
        spark.read.format("rabbitmq_streams")
        .options(**cfg["options"])
        .load()
        .select("stream", "offset", "value")
    )
    spark.sparkContext.setJobGroup("read", "the read under test")
    rows = df.mapInArrow(paced(cfg["started"]), df.schema).collect()
    killer.join(5)
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup("read"):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else []:
            st = tracker.getStageInfo(stage)
            failed += st.numFailedTasks if st else 0
    table = pa.table(
        {
            "stream": [r.stream for r in rows],
            "offset": [r.offset for r in rows],
            "value": [bytes(r.value) for r in rows],
        }
    )
    pq.write_table(table, cfg["out"])
    print(json.dumps({"killed": killed, "rows": len(rows), "failed_tasks": failed}), flush=True)
    spark.stop()


def stream(cfg: dict[str, Any]) -> None:
    spark = session("local[2]")
    writer = (
        spark.readStream.format("rabbitmq_streams")
        .options(**cfg["options"])
        .load()
        .select("stream", "offset", "value")
        .writeStream.format("parquet")
        .option("path", cfg["out"])
        .option("checkpointLocation", cfg["ckpt"])
    )
    if cfg.get("available_now"):
        q = writer.trigger(availableNow=True).start()
        q.awaitTermination()
        print(json.dumps({"drained": True}), flush=True)
        spark.stop()
        return
    q = writer.trigger(processingTime="200 milliseconds").start()
    q.awaitTermination()  # until the test kills this process


if __name__ == "__main__":
    mode, config = sys.argv[1], json.loads(sys.argv[2])
    {"read-kill-worker": read_kill_worker, "stream": stream}[mode](config)
