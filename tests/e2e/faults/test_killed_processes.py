"""Processes killed with SIGKILL: a Spark Python worker in the middle of `read()`, and a whole
streaming application (driver, JVM and workers), several times, while a producer keeps publishing."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.runs.outputs.committed import committed_dataset
from tests.e2e.faults.support import SteadyProducer, assert_exact, wait_for
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import client, conn_of, publish, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _job(mode: str, cfg: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.faults.spark_job", mode, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the JVM and the workers die with it
    )


def _finish(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the Spark job did not finish within {timeout_s} s:\n{err[-3000:]}") from None
    assert proc.returncode == 0, f"the Spark job failed ({proc.returncode}):\n{err[-3000:]}"
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_killed_python_worker_task_retry_returns_the_same_rows(
    broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fk")
    # 240,000 rows of 200 B in two tasks: the paced consumer passes 20,000 rows a second per task,
    # so each read takes ~6 s, while what can sit between the reader and it (socket buffers, a few
    # Arrow batches of 8,192 rows: ~1.6 MB each) is a small part of a task's 24 MB. The reader is
    # held back mid-read when killed, however fast it reads (bigger rows let it finish first).
    bodies = [f"k{i:07d}".ljust(200, ".").encode() for i in range(240_000)]
    publish(broker, s, bodies, batch=5000)
    out = tmp_path / "rows.parquet"
    cfg = {
        "port": broker.port,
        "out": str(out),
        "started": str(tmp_path / "started"),
        "options": spark_options(broker, stream=s, metadataFields="", minPartitions="2"),
    }
    # On a loaded machine the kill can land on a worker between reads; a second run is allowed,
    # and every run's rows are checked the same way.
    for attempt in (1, 2):
        result = _finish(_job("read-kill-worker", cfg), 300)
        assert result["killed"], "no reading worker was killed"
        if result["failed_tasks"] >= 1 or attempt == 2:
            break
        t = pq.read_table(out)
        assert t.num_rows == len(bodies)
        os.remove(tmp_path / "started")
    assert result["failed_tasks"] >= 1, "the kill failed no task: it did not hit a read"
    t = pq.read_table(out)
    cols = [t.column(c).to_pylist() for c in ("stream", "offset", "value")]
    rows = list(zip(*cols, strict=True))
    assert result["rows"] == len(bodies)
    assert_exact(rows, {s: bodies})


@pytest.mark.spark
def test_streaming_query_killed_and_restarted_under_a_producer(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    ss, parts = streams.super_stream(3, "fq")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    options = spark_options(broker, superstream=ss, metadataFields="", maxRecordsPerTrigger="1500")
    cfg = {"out": str(out), "ckpt": str(ckpt), "options": options}
    producer = SteadyProducer(broker, ss, superstream=True, rate=2000, name="fq-producer")
    producer.start()
    rng = random.Random(7)
    commits = ckpt / "commits"

    def committed() -> int:
        return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0

    kills = 0
    try:
        for _ in range(2):  # a restart after a restart: the second kill lands on a recovered query
            before = committed()
            proc = _job("stream", cfg)
            try:
                wait_for(
                    lambda b=before, p=proc: committed() > b or p.poll() is not None, 180, "a batch", 0.1
                )
                assert proc.poll() is None, f"the streaming job died by itself:\n{proc.stderr.read()[-3000:]}"  # type: ignore[union-attr]
                time.sleep(rng.uniform(0.2, 1.5))  # somewhere inside a later batch
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            kills += 1
    finally:
        sent = producer.finish()
    assert kills == 2
    # The drain replays the killed batch as logged, then takes the backlog in large batches: at 1,500
    # a batch it took 43 batches and 34 s alone (70,000 messages), a minute and more in the suite.
    drain = {**cfg, "available_now": True, "options": {**options, "maxRecordsPerTrigger": "200000"}}
    result = _finish(_job("stream", drain), 300)
    assert result == {"drained": True}
    tails = client(broker).tails(parts)
    conn = conn_of(broker)
    expected = {p: read_range(conn, p, 0, tails[p]).column("value").to_pylist() for p in parts}
    assert sorted(x for v in expected.values() for x in v) == sorted(sent), (
        "the producer lost or doubled data"
    )
    rows = [(r.stream, r.offset, bytes(r.value)) for r in spark.read.parquet(str(out)).collect()]
    # The file sink is exactly-once over the checkpoint: every offset once, none missing.
    assert_exact(rows, expected)
    # pyarrow, through the sink's log (`pyspark_rmqs.runs.outputs.committed`): the same rows, every
    # offset once; part files of the killed batches (partial, 0 bytes, or replayed) are not in the log.
    arrow = committed_dataset(str(out)).to_table(columns=["stream", "offset", "value"])
    cols = [arrow.column(c).to_pylist() for c in ("stream", "offset", "value")]
    assert_exact(list(zip(*cols, strict=True)), expected)
