"""Faults on the standalone cluster while a job runs: an executor JVM killed mid-read (its task is
retried on another executor) under the watermark protocol's exactly-once Parquet output, and a whole
worker lost mid-drain under a checkpointed AvailableNow query. Every offset counted afterwards."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs import jobs
from tests.conftest import StreamFactory
from tests.spark_cluster.checks import (
    PacedOutput,
    assert_each_offset_once,
    last_offsets,
    message_offsets,
    output_pairs,
    paced,
    task_attempts,
    wait_until,
)
from tests.spark_cluster.conftest import ClusterSession
from tests.spark_cluster.standalone import StandaloneCluster
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish, spark_options
from tests.support.threads import start_capturing

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _executor_id(proc: psutil.Process) -> str:
    cmd = proc.cmdline()
    return cmd[cmd.index("--executor-id") + 1]


def _running(ui: str) -> list[dict[str, Any]]:
    return [t for t in task_attempts(ui) if t["status"] == "RUNNING"]


def test_an_executor_killed_mid_read_is_retried_and_the_output_is_exactly_once(
    cluster_spark: SparkSession,
    cluster_session: ClusterSession,
    spark_cluster: StandaloneCluster,
    broker: BrokerSettings,
    streams: StreamFactory,
    tmp_path: Path,
) -> None:
    name, parts = streams.super_stream(3)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(3000)])
    conn = conn_of(broker)
    out = tmp_path / "out"
    plan = jobs.plan_read(conn, superstream=name, consumer="killed-executor")
    # ~7.5 s per task (3,000 rows, 100 per 0.25 s): the kill lands while a task is reading.
    sink = PacedOutput(str(out), rows=100, delay_s=0.25)
    run, failure = start_capturing(lambda: jobs.run_read(cluster_spark, conn, plan, sink))

    def busy_executor() -> psutil.Process | None:
        running = {t["executorId"] for t in _running(cluster_session.ui) if t.get("duration", 0) > 1000}
        return next((e for e in spark_cluster.executors() if _executor_id(e) in running), None)

    victim = wait_until(busy_executor, 300, "a task running on an executor for a second")
    assert isinstance(victim, psutil.Process)
    killed = _executor_id(victim)
    os.kill(victim.pid, signal.SIGKILL)
    run.join(600)
    assert not run.is_alive(), "the watermark run did not finish"
    assert not failure, failure
    # The killed executor's task failed there and succeeded on another executor.
    attempts = task_attempts(cluster_session.ui)
    lost = [t for t in attempts if t["executorId"] == killed and t["status"] != "SUCCESS"]
    assert lost, f"no task attempt was lost with executor {killed}: {attempts}"
    for t in lost:
        again = [
            a
            for a in attempts
            if (a["stage"], a["index"]) == (t["stage"], t["index"]) and a["status"] == "SUCCESS"
        ]
        assert again and all(a["executorId"] != killed for a in again), (t, again)
    assert_each_offset_once(output_pairs(out), message_offsets(broker, parts))
    assert client(broker).stored_offsets("killed-executor", parts) == last_offsets(broker, parts)


def test_a_worker_lost_mid_drain_leaves_every_offset_once(
    cluster_spark: SparkSession,
    cluster_session: ClusterSession,
    spark_cluster: StandaloneCluster,
    broker: BrokerSettings,
    streams: StreamFactory,
    tmp_path: Path,
) -> None:
    name, parts = streams.super_stream(3)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(2000)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = (
        cluster_spark.readStream.format("rabbitmq_streams")
        .options(**spark_options(broker, superstream=name, maxRecordsPerTrigger="3000"))
        .load()
        .select("stream", "offset", "value")
    )
    q = (
        df.mapInArrow(paced(100, 0.3), df.schema)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start(str(out))
    )
    lost = None
    try:
        running = wait_until(lambda: _running(cluster_session.ui), 300, "a drain task running")
        assert isinstance(running, list)
        busy = {t["executorId"] for t in running}
        lost = next(w for w in spark_cluster.workers if {_executor_id(e) for e in w.executors()} & busy)
        lost_ids = {_executor_id(e) for e in lost.executors()}
        lost.kill()  # the worker, its executor and that executor's Python workers, all at once
        assert q.awaitTermination(900), "the drain did not finish with one worker left"
        assert q.exception() is None, q.exception()
    finally:
        if q.isActive:
            q.stop()
        if lost is not None:  # back for the tests after this one
            spark_cluster.start_worker(int(lost.name.rsplit("-", 1)[1]))
            spark_cluster.wait_workers(2)
    assert lost is not None
    failed = [
        t
        for t in task_attempts(cluster_session.ui)
        if t["executorId"] in lost_ids and t["status"] != "SUCCESS"
    ]
    assert failed, f"no task attempt was lost with the worker's executors {lost_ids}"
    # The file sink's log (_spark_metadata) is what a Spark reader trusts: files of lost attempts aside.
    rows = cluster_spark.read.parquet(str(out)).select("stream", "offset").collect()
    assert_each_offset_once([(r.stream, r.offset) for r in rows], message_offsets(broker, parts))
