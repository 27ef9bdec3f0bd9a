"""Exactly-once into files: the process SIGKILLed at each point of a run, then retried, every offset once.

Kill points: while the sink writes (files staged, not published), after the commit record and before
the watermark store, and after the store. Each killed run is followed by a retry in this process; the
output is counted per `(stream, offset)`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyspark_rmqs import jobs
from pyspark_rmqs.runs.outputs.delivery import COMMITS, STAGING
from pyspark_rmqs.runs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _killed_run(broker: BrokerSettings, stream: str, consumer: str, out: Path, kill: str) -> None:
    cfg = {
        "endpoints": f"{broker.host}:{broker.port}",
        "username": broker.username,
        "password": broker.password,
        "vhost": broker.vhost,
        "stream": stream,
        "consumer": consumer,
        "out": str(out),
        "kill": kill,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.faults.exactly_once_job", json.dumps(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -9, f"the run was not killed ({done.returncode}): {done.stderr[-3000:]}"


def _offsets(spark: Any, out: Path) -> list[tuple[str, int]]:
    return sorted(
        (r.stream, r.offset) for r in spark.read.parquet(str(out)).select("stream", "offset").collect()
    )


@pytest.mark.parametrize("kill", ["sink", "commit", "stored"])
def test_a_run_killed_anywhere_then_retried_writes_every_offset_once(
    spark: Any, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path, kill: str
) -> None:
    s = streams.stream("eo")
    conn = conn_of(broker)
    publish(broker, s, [f"m{i}".encode() for i in range(500)])
    out = tmp_path / "out"
    _killed_run(broker, s, "eo", out, kill)
    stored = watermarks(conn, "eo", stream=s).partitions[0].stored
    assert stored == (499 if kill == "stored" else None)
    # The retry: a new process (here, this one) runs the same pipeline.
    retry = jobs.plan_read(conn, stream=s, consumer="eo")
    summary = jobs.run_read(spark, conn, retry, jobs.write_output(str(out)))
    assert watermarks(conn, "eo", stream=s).partitions[0].stored == 499
    assert _offsets(spark, out) == [(s, o) for o in range(500)]  # every offset exactly once
    if kill == "commit":  # committed before the kill: the retry only stored the watermark
        assert summary.extra.get("sink_skipped") is True and summary.records_written == 0
    if kill == "sink":  # nothing was published: the retry wrote the range
        assert retry.resumed and summary.records_written == 500
    if kill == "stored":  # the run finished: nothing pending, nothing read
        assert retry.is_empty and summary.records_written == 0
    assert not (out / STAGING).exists()  # no staged leftovers once a run committed
    assert len(list((out / COMMITS).glob("*.json"))) == 1
    # New data after all that: the next run adds exactly it.
    publish(broker, s, [f"n{i}".encode() for i in range(50)])
    tail = client(broker).tail(s)
    nxt = jobs.plan_read(conn, stream=s, consumer="eo")
    jobs.run_read(spark, conn, nxt, jobs.write_output(str(out)))
    got = _offsets(spark, out)
    assert got[:500] == [(s, o) for o in range(500)]
    assert got[500:] == [(s, o) for o in range(tail - 50, tail)]


def test_at_least_once_delivery_writes_a_replayed_range_again(
    spark: Any, broker: BrokerSettings, streams: StreamFactory, tmp_path: Path
) -> None:
    """The explicit opt-out does what it says: a retry after the sink wrote adds the range again."""
    s = streams.stream("alo")
    conn = conn_of(broker)
    publish(broker, s, [f"m{i}".encode() for i in range(100)])
    out = tmp_path / "out"
    sink = jobs.write_output(str(out), delivery="at_least_once")
    plan = jobs.plan_read(conn, stream=s, consumer="alo")
    jobs.run_read(spark, conn, plan, sink, store_watermark=False)  # as if the store failed
    retry = jobs.plan_read(conn, stream=s, consumer="alo")
    assert retry.resumed
    jobs.run_read(spark, conn, retry, sink)
    assert _offsets(spark, out) == sorted([(s, o) for o in range(100)] * 2)
