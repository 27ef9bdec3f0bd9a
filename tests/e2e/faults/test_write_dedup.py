"""`producerName` under real failures: a Spark task attempt that fails mid-write and is retried, and
a streaming application killed after its sink sent part of an epoch but before the epoch was
committed. The broker must drop exactly what was re-sent: every row once, none lost."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs.broker.reader import read_range
from pyspark_rmqs.options import parse_sink_options
from pyspark_rmqs.spark.sink import RabbitMQStreamsWriter
from tests.e2e.faults.support import wait_for
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import client, conn_of, publish, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _job(mode: str, cfg: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.faults.write_job", mode, json.dumps(cfg)],
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


def _stored(b: BrokerSettings, stream: str) -> list[bytes]:
    return list(read_range(conn_of(b), stream, 0, client(b).tail(stream)).column("value").to_pylist())


def _assert_each_once(got: list[bytes], expected: list[bytes]) -> None:
    dups = len(got) - len(set(got))
    missing = sorted(set(expected) - set(got))
    assert dups == 0 and not missing and sorted(got) == sorted(expected), (
        f"{len(got)} messages for {len(expected)} rows: {dups} duplicate(s), {len(missing)} missing "
        f"(first: {missing[:3]})"
    )


def test_a_retried_task_attempt_adds_no_duplicates(broker: BrokerSettings, streams, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    target = streams.stream("dr")
    # 2 partitions of 1,000 rows; partition 0's first attempt passes 500 of them on, waits until the
    # broker holds at least 250 (a Python worker buffers some of its output), and fails.
    n = 2000
    stored = tmp_path / "stored"
    cfg = {
        "options": spark_options(broker),
        "target": target,
        "rows": n,
        "wait_tail": n // 2 + n // 8,
        "stored": str(stored),
    }
    result = _finish(_job("retry", cfg), 300)
    assert stored.exists(), "the failed attempt did not get 250 of its rows into the broker"
    assert result["failed_tasks"] == 1, "the first attempt of partition 0 should have failed once"
    _assert_each_once(_stored(broker, target), [f"r{i:07d}".ljust(1000, ".").encode() for i in range(n)])


def _two_attempts(
    broker: BrokerSettings,
    s: str,
    options: dict[str, str],
    first: list[bytes],
    second: list[bytes],
    sent: int,
) -> list[bytes]:
    """One write task's two attempts as Spark runs them: the job's writer (built once on the driver)
    pickled to each attempt, both on partition 0. The first sends `sent` rows of `first`, waits until
    the broker stored them and fails; the retry sends all of `second`. Returns what the stream holds."""
    opts = parse_sink_options(spark_options(broker, stream=s, **options))
    writer = RabbitMQStreamsWriter(opts, ["value"])

    def attempt(order: list[bytes], fail_after: int | None) -> Iterator[pa.RecordBatch]:
        for at in range(0, len(order), 100):
            if at == fail_after:
                deadline = time.monotonic() + 30
                while client(broker).tail(s) < fail_after:  # the broker stored what it was sent
                    assert time.monotonic() < deadline, "the first attempt's rows never reached the broker"
                    time.sleep(0.05)
                raise RuntimeError("injected failure of the first attempt")
            yield pa.RecordBatch.from_pydict({"value": order[at : at + 100]})

    with pytest.raises(RuntimeError, match="injected failure"):
        pickle.loads(pickle.dumps(writer)).write(attempt(first, fail_after=sent))
    assert client(broker).tail(s) == sent
    pickle.loads(pickle.dumps(writer)).write(attempt(second, fail_after=None))  # the retried attempt
    return _stored(broker, s)


def test_a_retried_task_attempt_yielding_other_rows_loses_rows_and_repeats_others(
    broker: BrokerSettings, streams: Any
) -> None:
    """Publishing ids are positions, not contents: the n-th row a task sends to a partition stream
    carries id n under a name all its attempts share. A first attempt sends 1,000 of 2,000 rows in one
    order, the broker stores them, and it fails; the retried attempt yields the same 2,000 rows in
    another order (non-deterministic input: an unordered shuffle, `rand()`). The broker drops the
    retry's first 1,000, whatever they hold, and keeps the rest: the stream holds exactly the first
    attempt's 1,000 then the retry's last 1,000, so about 500 rows are never stored (new rows dropped
    as re-sent) and about 500 are stored twice."""
    s = streams.stream("dn")
    n, sent = 2000, 1000
    rows = [f"u{i:06d}".encode() for i in range(n)]
    first, second = random.Random(1).sample(rows, n), random.Random(2).sample(rows, n)
    got = _two_attempts(broker, s, {"producerName": "unordered"}, first, second, sent)
    assert got == first[:sent] + second[sent:], "the broker did not deduplicate by position"
    counts = Counter(got)
    lost = [r for r in rows if r not in counts]
    twice = [r for r, c in counts.items() if c == 2]
    assert len(lost) == len(twice) and 400 <= len(lost) <= 600, (len(lost), len(twice))
    assert set(lost) == set(second[:sent]) - set(first[:sent]), "a lost row is not one the retry put first"


def test_a_retried_task_attempt_without_a_producer_name_publishes_every_row_again(
    broker: BrokerSettings, streams: Any
) -> None:
    """Without `producerName` nothing is deduplicated: a first attempt stores 1,000 of 2,000 rows and
    fails, its retry sends all 2,000 again, and the stream holds 3,000: every row at least once, the
    first attempt's 1,000 twice (at-least-once, nothing lost, in whatever order the retry yields)."""
    s = streams.stream("dw")
    n, sent = 2000, 1000
    rows = [f"w{i:06d}".encode() for i in range(n)]
    second = random.Random(3).sample(rows, n)
    got = _two_attempts(broker, s, {}, rows, second, sent)
    assert got == rows[:sent] + second
    counts = Counter(got)
    assert set(counts) == set(rows) and sorted(counts.values()) == [1] * (n - sent) + [2] * sent


@pytest.mark.spark
def test_a_streaming_epoch_replayed_after_a_crash_adds_no_duplicates(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    source, target = streams.stream("ds"), streams.stream("dt")
    bodies = [f"e{i:07d}".ljust(1000, ".").encode() for i in range(6000)]
    publish(broker, source, bodies)
    ckpt, paused = tmp_path / "ckpt", tmp_path / "paused"
    # Epochs of 2,000 rows in 2 splits of 1,000. In epoch 1, split 0 passes 500 rows on and waits
    # until the broker holds at least 3,250 messages (2,000 of epoch 0, 1,000 of split 1 and 250 of
    # its own: a Python worker buffers some of its output); then the application is killed.
    cfg = {
        "options": spark_options(broker),
        "source": source,
        "target": target,
        "per_epoch": 2000,
        "pause_epoch": 1,
        "pause_at": 3250,
        "paused": str(paused),
        "ckpt": str(ckpt),
    }
    proc = _job("stream", cfg)
    try:
        wait_for(lambda: paused.exists() or proc.poll() is not None, 240, "the sink to pause in epoch 1", 0.1)
        assert proc.poll() is None, f"the streaming job died by itself:\n{proc.stderr.read()[-3000:]}"  # type: ignore[union-attr]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    stored = client(broker).tail(target)
    assert 3250 <= stored <= 3500, (
        f"the killed epoch should have stored 1,250 to 1,500 rows, not {stored - 2000}"
    )
    assert not (ckpt / "commits" / "1").exists(), "epoch 1 must not be committed when the job is killed"

    # Restarted on the same checkpoint (same query id): epoch 1 is replayed and must add only its rest.
    q = (
        spark.readStream.format("rabbitmq_streams")
        .options(
            **spark_options(
                broker, stream=source, maxRecordsPerTrigger="2000", minPartitions="2", metadataFields=""
            )
        )
        .load()
        .select("value")
        .writeStream.format("rabbitmq_streams")
        .options(**spark_options(broker, stream=target, producerName="replayed"))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(240)
    assert q.exception() is None
    _assert_each_once(_stored(broker, target), bodies)
