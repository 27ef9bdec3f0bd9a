"""Exactly-once into an Iceberg table whose warehouse is on S3 (moto's server on loopback).

A Spark-free consume run into the table is SIGKILLed with its data files in the warehouse but no
table commit (`table`), after the commit but before the run record says `delivered`, and after
that but before the watermark store (`commit`); the retry appends only what the table does not
hold: every (stream, offset) once in the table, and the credentials in no summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyspark_rmqs import jobs
from pyspark_rmqs.runs import consume
from pyspark_rmqs.runs.outputs.iceberg import TOKEN_PROPERTY, IcebergSink
from pyspark_rmqs.runs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.e2e.faults.support import killed_consume_job
from tests.support.broker import BrokerSettings
from tests.support.data import conn_of, publish
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.broker]

N = 300


@pytest.mark.parametrize("kill", ["table", "delivered", "commit"])
def test_a_consume_run_into_iceberg_on_s3_killed_around_its_commit_then_retried_appends_once(
    broker: BrokerSettings, streams: StreamFactory, s3: S3Server, tmp_path: Path, kill: str
) -> None:
    from pyiceberg.catalog import load_catalog

    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(N)])
    bucket = s3.new_bucket()
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"s3://{bucket}/wh"}
    cfg = {
        "endpoints": f"{broker.host}:{broker.port}",
        "username": broker.username,
        "password": broker.password,
        "vhost": broker.vhost,
        "superstream": name,
        "consumer": "eoi",
        "out": "lake.orders",
        "kill": kill,
        "iceberg": catalog,
    }
    done = killed_consume_job(cfg, s3.env())
    props = {
        **catalog,
        "s3.access-key-id": s3.key,
        "s3.secret-access-key": s3.secret,
        "s3.endpoint": s3.endpoint,
        "s3.region": s3.region,
    }
    if kill == "table":  # data files written to the warehouse, no snapshot names them
        assert [k for k in s3.keys(bucket, "wh/") if k.endswith(".parquet") and "/data/" in k]
    conn = conn_of(broker)
    retry = jobs.plan_read(conn, superstream=name, consumer="eoi")
    summary = consume.run_consume(conn, retry, IcebergSink("lake.orders", props))
    table = load_catalog("rmqs", **props).load_table("lake.orders")
    rows = table.scan(selected_fields=("stream", "offset")).to_arrow()
    got = sorted(zip(rows.column("stream").to_pylist(), rows.column("offset").to_pylist(), strict=True))
    assert got == sorted((p, o) for p in parts for o in range(N))  # every (stream, offset) once
    tokens = {s.summary.additional_properties.get(TOKEN_PROPERTY) for s in table.metadata.snapshots}
    assert tokens == {summary.token}  # one run's appends only
    assert {
        p.stream: p.stored for p in watermarks(conn, "eoi", superstream=name).partitions
    } == dict.fromkeys(parts, N - 1)
    if kill == "table":
        assert summary.records_written == 2 * N
    else:
        assert summary.extra.get("sink_skipped") is True
    shown = json.dumps(summary.to_dict(), default=str) + done.stdout + done.stderr
    assert s3.secret not in shown and s3.key not in shown
