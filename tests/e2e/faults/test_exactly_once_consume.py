"""Exactly-once without Spark: a consume run into Parquet SIGKILLed at each point, then retried."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyspark_rmqs import jobs
from pyspark_rmqs.runs import consume
from pyspark_rmqs.runs.outputs.delivery import COMMITS
from pyspark_rmqs.runs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.e2e.faults.support import killed_consume_job, output_offsets
from tests.support.broker import BrokerSettings
from tests.support.data import conn_of, publish

pytestmark = [pytest.mark.broker]


@pytest.mark.parametrize("kill", ["sink", "commit", "stored"])
def test_a_consume_run_killed_anywhere_then_retried_writes_every_offset_once(
    broker: BrokerSettings, streams: StreamFactory, tmp_path: Path, kill: str
) -> None:
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(300)])
    conn = conn_of(broker)
    out = tmp_path / "out"
    cfg = {
        "endpoints": f"{broker.host}:{broker.port}",
        "username": broker.username,
        "password": broker.password,
        "vhost": broker.vhost,
        "superstream": name,
        "consumer": "eoc",
        "out": str(out),
        "kill": kill,
    }
    killed_consume_job(cfg)
    retry = jobs.plan_read(conn, superstream=name, consumer="eoc")
    summary = consume.run_consume(conn, retry, consume.ParquetSink(str(out)))
    expected = sorted((p, o) for p in parts for o in range(300))
    assert output_offsets(out) == expected  # every (stream, offset) exactly once
    assert {
        p.stream: p.stored for p in watermarks(conn, "eoc", superstream=name).partitions
    } == dict.fromkeys(parts, 299)
    if kill == "commit":
        assert summary.extra.get("sink_skipped") is True and summary.records_written == 0
    if kill == "sink":
        assert retry.resumed and summary.records_written == 600
    if kill == "stored":
        assert retry.is_empty
    assert len(list((out / COMMITS).glob("*.json"))) == 1
