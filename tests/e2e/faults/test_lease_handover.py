"""A run's lease handed to the next run when the holder's process stops answering (docs/semantics.md,
"The lease"): killed, at once; paused (SIGSTOP), after missed heartbeats. And what the paused holder
does once it runs again (docs/failure-semantics.md, "The watermark protocol").

The holder is a Spark-free watermark run in a process of its own (`holder_job.py`), stopped with the
whole range handed to its exactly-once Parquet output and before its commit; the paused one asks
for a 2 s heartbeat (rmqs asks for 60 s: the same handover, after minutes), the killed one keeps
60 s. The next run is this test's,
on the shared broker (only the holder's process is paused). Each test counts offsets: what each
run's sink was handed, what the output committed, where the watermark and the record pointer are.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from pyspark_rmqs import consume, jobs
from pyspark_rmqs.errors import ConsumerBusyError
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.runs.outputs.committed import committed_dataset, committed_files
from pyspark_rmqs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.e2e.faults.support import wait_for
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.broker, pytest.mark.slow]
N = 3000
HEARTBEAT_S = 2


class Holder:
    """The holding run's process and the files it talks through (`holder_job.py`)."""

    def __init__(
        self, broker: BrokerSettings, stream: str, consumer: str, tmp: Path, heartbeat_s: int
    ) -> None:
        self.out, self.seen, self.ready, self.go = tmp / "out", tmp / "seen", tmp / "ready", tmp / "go"
        cfg = {
            **broker.spark_options,
            "stream": stream,
            "consumer": consumer,
            "out": str(self.out),
            "seen": str(self.seen),
            "ready": str(self.ready),
            "go": str(self.go),
            "heartbeat_s": heartbeat_s,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.faults.holder_job", json.dumps(cfg)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self) -> None:
        """Until the run has its whole range in its sink and waits before its commit."""
        wait_for(lambda: self.ready.exists() or self.proc.poll() is not None, 120, "the holder's sink", 0.05)
        if self.proc.poll() is not None:
            _, err = self.proc.communicate()
            raise AssertionError(f"the holding run ended by itself:\n{err[-3000:]}")

    def handed(self) -> Counter[int]:
        """Every offset the holder's sink was handed, with how often."""
        return Counter(int(line) for line in self.seen.read_text().split())

    def result(self) -> dict[str, Any]:
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, f"the holding run crashed ({self.proc.returncode}):\n{err[-3000:]}"
        return dict(json.loads(out.strip().splitlines()[-1]))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.communicate()


def _take_over(
    broker: BrokerSettings, stream: str, consumer: str, out: Path, wait_s: float
) -> tuple[float, list[int]]:
    """The next run of the name: how long it waited for the lease, and the offsets it delivered
    (into the same output folder, as a retry of the holder's task would)."""
    conn = conn_of(broker)
    asked = time.monotonic()
    plan = jobs.plan_read(conn, stream=stream, consumer=consumer, lease_wait_s=wait_s)
    waited = time.monotonic() - asked
    assert plan.resumed and plan.ranges == {stream: (0, N)}, "the next run did not resume the holder's record"
    delivered: list[int] = []

    class Counting(consume.ParquetSink):
        def write(self, batch: Any) -> None:
            delivered.extend(batch.column("offset").to_pylist())
            super().write(batch)

    summary = consume.run_consume(conn, plan, Counting(str(out)))
    assert summary.rows == N and summary.watermark_stored
    return waited, delivered


def _assert_committed_once(out: Path) -> None:
    """The output holds every offset once: through its commit records and by listing the folder."""
    assert len(committed_files(str(out))) == 1, "one run's one file is committed"
    for table in (
        committed_dataset(str(out)).to_table(columns=["offset"]),
        ds.dataset(str(out), format="parquet").to_table(columns=["offset"]),
    ):
        counts = Counter(table.column("offset").to_pylist())
        assert sorted(counts) == list(range(N)) and max(counts.values()) == 1


def test_a_paused_holder_loses_its_lease_after_missed_heartbeats_and_then_commits_nothing(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """Paused with its whole range in its sink: the lease stays the holder's (a run asking is turned
    away) until the broker misses its heartbeats and closes its connection; then the next run takes
    the name, resumes the record and delivers the range. Resumed, the holder fails with the retryable
    `LeaseLostError` (`before_commit`) and commits and stores nothing: the range reached the two
    runs' sinks once each (an at-least-once sink receives it twice), the exactly-once output holds
    every offset once, and the watermark and record pointer are the next run's."""
    s = streams.stream("paused-holder")
    publish(broker, s, [b"m%05d" % i for i in range(N)])
    holder = Holder(broker, s, "held", tmp_path, HEARTBEAT_S)
    try:
        holder.wait_ready()
        os.kill(holder.proc.pid, signal.SIGSTOP)
        conn = conn_of(broker)
        with pytest.raises(ConsumerBusyError):  # paused is not gone: the holder keeps the name for now
            jobs.plan_read(conn, stream=s, consumer="held", lease_wait_s=0.5)
        waited, delivered = _take_over(broker, s, "held", holder.out, wait_s=40)
        # Two missed heartbeats at least, and not much more than three (the check runs per interval).
        assert HEARTBEAT_S <= waited + 0.5 < 8 * HEARTBEAT_S, f"lease handed over after {waited:.1f} s"
        pointer = client(broker).stored_offset(run_record.run_key("held", s), run_record.RUNS_STREAM)
        os.kill(holder.proc.pid, signal.SIGCONT)
        time.sleep(1)  # it sees its connections closed (else the fence before its commit stops it)
        holder.go.touch()
        result = holder.result()
    finally:
        holder.kill()
    assert result.get("error") == "LeaseLostError", f"the paused holder went on: {result}"
    assert result["retryable"] and result["commit_state"] == "before_commit"
    assert "consumer 'held'" in result["message"]
    handed = holder.handed()
    assert sorted(handed) == list(range(N)) and max(handed.values()) == 1
    assert Counter(delivered) == handed, "the next run delivered another range than the holder had"
    _assert_committed_once(holder.out)
    assert watermarks(conn, "held", stream=s).partitions[0].stored == N - 1
    after = client(broker).stored_offset(run_record.run_key("held", s), run_record.RUNS_STREAM)
    assert after == pointer, "the resumed holder wrote a record"
    nxt = jobs.plan_read(conn, stream=s, consumer="held")
    assert nxt.is_empty, f"a run after both plans {nxt.ranges}"
    nxt.release()


def test_a_killed_holders_lease_goes_to_the_next_run_at_once(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """Killed with its whole range in its sink: the broker hands the name on as the process's
    connections close, not after missed heartbeats (the holder keeps rmqs's 60 s heartbeat here, so
    a handover within seconds can only come from the closed connection); the next run delivers the
    range: every offset once in the output, the watermark at the tail."""
    s = streams.stream("killed-holder")
    publish(broker, s, [b"m%05d" % i for i in range(N)])
    holder = Holder(broker, s, "gone", tmp_path, heartbeat_s=60)
    try:
        holder.wait_ready()
        holder.proc.kill()
        holder.proc.communicate()
        waited, delivered = _take_over(broker, s, "gone", holder.out, wait_s=10)
    finally:
        holder.kill()
    assert waited < 10, f"the lease was handed over after {waited:.1f} s, not at once"
    assert sorted(delivered) == list(range(N))
    _assert_committed_once(holder.out)
    assert watermarks(conn_of(broker), "gone", stream=s).partitions[0].stored == N - 1
