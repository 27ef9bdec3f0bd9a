"""Exactly-once into an object store: Spark-free consume runs into `s3://` against a real S3 endpoint.

The endpoint is moto's server on loopback (tests/support/s3.py), IAM enforced. A run's process is
SIGKILLed at every point of its commit (kill_points.py), then retried; every (stream, offset) is
in the output once, for a reader going through the commit records (`committed.py`) and for one
listing the prefix; nothing of a run killed before its commit record counts as committed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_rmqs import jobs
from pyspark_rmqs.core.errors import CommitState, ConsumerBusyError
from pyspark_rmqs.runs import consume
from pyspark_rmqs.runs.outputs import committed
from pyspark_rmqs.runs.watermarks import watermarks
from tests.conftest import StreamFactory
from tests.e2e.faults.airflow_job import XCOM
from tests.e2e.faults.support import killed_consume_job
from tests.support.broker import REPO, BrokerSettings
from tests.support.data import conn_of, publish
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.broker]

N = 300


def offsets_of(table: Any) -> list[tuple[str, int]]:
    return sorted(zip(table.column("stream").to_pylist(), table.column("offset").to_pylist(), strict=True))


def committed_offsets(out: str, s3: S3Server) -> list[tuple[str, int]]:
    """What a reader going through the commit records sees."""
    if not committed.committed_files(out, storage_options=s3.storage_options()):
        return []
    dataset = committed.committed_dataset(out, storage_options=s3.storage_options())
    return offsets_of(dataset.to_table(columns=["stream", "offset"]))


def listed_offsets(bucket: str, prefix: str, s3: S3Server) -> list[tuple[str, int]]:
    """What a reader listing the prefix sees (pyarrow skips `_` and `.` names: the commit records)."""
    import pyarrow.dataset as ds

    dataset = ds.dataset(f"{bucket}/{prefix}", filesystem=s3.pyarrow_fs(), format="parquet")
    return offsets_of(dataset.to_table(columns=["stream", "offset"]))


def cfg_of(broker: BrokerSettings, superstream: str, out: str, kill: str, storage: str) -> dict[str, str]:
    return {
        "endpoints": f"{broker.host}:{broker.port}",
        "username": broker.username,
        "password": broker.password,
        "vhost": broker.vhost,
        "superstream": superstream,
        "consumer": "eos3",
        "out": out,
        "kill": kill,
        "storage": storage,
    }


@pytest.mark.parametrize(
    ("kill", "storage"),
    [
        ("writing", "pyarrow"),  # inside the first object's upload
        ("sink", "fsspec"),  # the first partition's object complete, the second not written
        ("manifest", "pyarrow"),  # every object complete, no commit record
        ("delivered", "fsspec"),  # the commit record written, the run record not `delivered`
        ("commit", "pyarrow"),  # the run record `delivered`, the watermark not stored
        ("stored", "fsspec"),  # the watermark stored
    ],
)
def test_a_consume_run_into_s3_killed_at_every_commit_point_then_retried_writes_every_offset_once(
    broker: BrokerSettings,
    streams: StreamFactory,
    s3: S3Server,
    caplog: pytest.LogCaptureFixture,
    kill: str,
    storage: str,
) -> None:
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(N)])
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/orders"
    done = killed_consume_job(cfg_of(broker, name, out, kill, storage), s3.env())
    expected = sorted((p, o) for p in parts for o in range(N))
    before = committed_offsets(out, s3)
    if kill in ("writing", "sink", "manifest"):  # no commit record: nothing of the run is committed
        assert before == []
    else:
        assert before == expected
    if kill == "writing":  # an upload that never completed leaves no object at all
        assert s3.keys(bucket) == []

    conn = conn_of(broker)
    caplog.set_level(logging.DEBUG, logger="pyspark_rmqs")
    retry = jobs.plan_read(conn, superstream=name, consumer="eos3")
    sink = (
        consume.ParquetSink(out, filesystem=s3.pyarrow_fs())
        if storage == "fsspec"  # the retry reaches the store the other way
        else consume.ParquetSink(out, storage_options=s3.storage_options())
    )
    summary = consume.run_consume(conn, retry, sink)

    assert committed_offsets(out, s3) == expected  # every (stream, offset) exactly once
    assert listed_offsets(bucket, "orders", s3) == expected  # a listing reader too, after the retry
    assert {
        p.stream: p.stored for p in watermarks(conn, "eos3", superstream=name).partitions
    } == dict.fromkeys(parts, N - 1)
    assert len([k for k in s3.keys(bucket, "orders/_rmqs_commits/") if k.endswith(".json")]) == 1
    assert summary.delivery == "exactly_once"
    if kill in ("writing", "sink", "manifest"):
        assert retry.resumed and summary.records_written == 2 * N
    if kill in ("delivered", "commit"):
        assert summary.extra.get("sink_skipped") is True and summary.records_written in (0, None)
    if kill == "stored":
        assert retry.is_empty
    shown = json.dumps(summary.to_dict(), default=str) + caplog.text + done.stdout + done.stderr
    assert s3.secret not in shown and s3.key not in shown


def test_a_bucket_refusing_writes_fails_the_run_before_the_watermark_moves(
    broker: BrokerSettings, streams: StreamFactory, s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A user whose policy allows reading and listing but not `s3:PutObject`: the run fails with the
    store's refusal (`before_commit`), the watermark and the bucket are as they were, the secret is
    in no message; the retry with a user allowed to write delivers every offset once."""
    name = streams.stream()
    publish(broker, name, [f"m{i}".encode() for i in range(N)])
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/orders"
    key, secret = s3.user(["s3:GetObject", "s3:ListBucket"], deny=["s3:PutObject"])
    conn = conn_of(broker)
    # Every logger at DEBUG (botocore and s3fs included): the secret is in none of their lines; the
    # access key id is checked in rmqs's own (botocore's DEBUG log prints it in its signing lines).
    caplog.set_level(logging.DEBUG)
    plan = jobs.plan_read(conn, stream=name, consumer="ro")
    with pytest.raises(OSError) as failed:
        consume.run_consume(
            conn, plan, consume.ParquetSink(out, storage_options=s3.storage_options(key, secret))
        )
    assert getattr(failed.value, "commit_state", None) == CommitState.BEFORE
    assert "AccessDenied" in str(failed.value) or "Access Denied" in str(failed.value)
    assert watermarks(conn, "ro", stream=name).partitions[0].stored is None
    assert s3.keys(bucket) == []
    shown = str(failed.value) + repr(failed.value)
    ours = "".join(r.getMessage() for r in caplog.records if r.name.startswith("pyspark_rmqs"))
    assert secret not in shown + caplog.text and key not in shown + ours

    retry = jobs.plan_read(conn, stream=name, consumer="ro")
    consume.run_consume(conn, retry, consume.ParquetSink(out, storage_options=s3.storage_options()))
    assert committed_offsets(out, s3) == [(name, o) for o in range(N)]
    assert watermarks(conn, "ro", stream=name).partitions[0].stored == N - 1


def test_two_tries_of_one_consume_run_into_s3_at_once_write_every_offset_once(
    broker: BrokerSettings, streams: StreamFactory, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A try still writing its objects (a zombie) and its retry: the retry fails with
    `ConsumerBusyError` before it reads or writes anything; the first delivers; every offset once,
    one commit record."""
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(N)])
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/orders"
    conn = conn_of(broker)
    inside, finish = threading.Event(), threading.Event()
    real_write = consume.ParquetSink.write

    def held_write(self: consume.ParquetSink, batch: Any) -> None:
        if threading.current_thread().name == "first-try":
            inside.set()
            assert finish.wait(60)
        real_write(self, batch)

    monkeypatch.setattr(consume.ParquetSink, "write", held_write)

    def one_try(wait_s: float) -> jobs.RunSummary:
        plan = jobs.plan_read(conn, superstream=name, consumer="twice", lease_wait_s=wait_s)
        return consume.run_consume(conn, plan, consume.ParquetSink(out, storage_options=s3.storage_options()))

    result: list[jobs.RunSummary] = []
    first = threading.Thread(target=lambda: result.append(one_try(30)), name="first-try")
    first.start()
    assert inside.wait(60)
    with pytest.raises(ConsumerBusyError):
        one_try(1)
    assert s3.keys(bucket) == []  # the retry wrote nothing; the first's upload is not complete
    finish.set()
    first.join(60)
    assert result and result[0].records_written == 2 * N
    expected = sorted((p, o) for p in parts for o in range(N))
    assert committed_offsets(out, s3) == expected
    assert listed_offsets(bucket, "orders", s3) == expected
    assert len([k for k in s3.keys(bucket, "orders/_rmqs_commits/") if k.endswith(".json")]) == 1


@pytest.mark.airflow
@pytest.mark.parametrize("kill", ["sink", "commit"])
def test_an_airflow_consume_task_into_s3_killed_after_its_sink_then_retried_finds_every_offset_once(
    broker: BrokerSettings, streams: StreamFactory, s3: S3Server, tmp_path: Path, kill: str
) -> None:
    """`RabbitMQStreamConsumeOperator(output_path="s3://...", output_conn_id=...)`, the output's
    credentials in an `aws`-style Airflow connection from the environment: the task process
    SIGKILLed after its first object (`sink`) or after its commit (`commit`), retried in a fresh
    process; every (stream, offset) once, and the credentials in neither the XCom value nor the
    task's output."""
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(N)])
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/orders"
    home = tmp_path / "airflow_home"
    home.mkdir()
    lake = {
        "conn_type": "aws",
        "login": s3.key,
        "password": s3.secret,
        "extra": {"endpoint_url": s3.endpoint, "region_name": s3.region},
    }
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_RMQS_FAULTS": broker.uri,
        "AIRFLOW_CONN_LAKE_S3": json.dumps(lake),
    }
    cfg = {
        "operator": "consume",
        "conn_id": "rmqs_faults",
        "output_conn_id": "lake_s3",
        "superstream": name,
        "consumer": "eoa",
        "out": out,
    }

    def one_try(kill: str, try_number: int) -> subprocess.CompletedProcess[str]:
        job = {**cfg, "kill": kill, "try_number": try_number}
        return subprocess.run(
            [sys.executable, "-m", "tests.e2e.faults.airflow_job", json.dumps(job)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = one_try(kill, 1)
    assert first.returncode == -9, f"the task was not killed ({first.returncode}): {first.stderr[-3000:]}"
    retry = one_try("none", 2)
    assert retry.returncode == 0, f"the retry failed ({retry.returncode}): {retry.stderr[-3000:]}"
    lines = [x for x in retry.stdout.splitlines() if x.startswith(XCOM)]
    xcom = json.loads(lines[0][len(XCOM) :])
    expected = sorted((p, o) for p in parts for o in range(N))
    assert committed_offsets(out, s3) == expected
    assert listed_offsets(bucket, "orders", s3) == expected
    conn = conn_of(broker)
    assert {
        p.stream: p.stored for p in watermarks(conn, "eoa", superstream=name).partitions
    } == dict.fromkeys(parts, N - 1)
    assert xcom["delivery"] == "exactly_once" and xcom["retry_count"] == 1
    if kill == "sink":
        assert xcom["records_written"] == 2 * N
        assert all(f.startswith(f"s3://{bucket}/orders/") for f in xcom["files"])
    else:
        assert xcom["sink_skipped"] is True
    for shown in (json.dumps(xcom), first.stdout + first.stderr, retry.stdout + retry.stderr):
        assert s3.secret not in shown and s3.key not in shown


def test_a_watermark_put_back_by_another_client_writes_nothing_twice_into_s3(
    broker: BrokerSettings, streams: StreamFactory, s3: S3Server
) -> None:
    """Commits in the bucket are recognised per partition range (the manifests of earlier runs,
    read back from the store): after three runs, a client that is not rmqs puts one partition's
    stored offset back and 20 messages arrive; the next run writes only those 20."""
    from tests.support.data import client

    name, parts = streams.super_stream(2)
    conn = conn_of(broker)
    out = f"s3://{s3.new_bucket()}/orders"

    def run() -> jobs.RunSummary:
        plan = jobs.plan_read(conn, superstream=name, consumer="back")
        return consume.run_consume(conn, plan, consume.ParquetSink(out, storage_options=s3.storage_options()))

    for batch in range(3):  # three runs: three manifests for the next run to read back
        for p in parts:
            publish(broker, p, [f"{p}:{batch}:{i}".encode() for i in range(100)])
        last = run()
        assert last.rows == 200
    end = last.end_offsets[parts[1]]  # 300 messages, and the runs' own offset-tracking entries
    client(broker).store_offsets("back", {parts[1]: 99})  # not rmqs: a raw store, backwards
    publish(broker, parts[1], [b"late"] * 20)
    again = run()
    assert again.extra["already_committed"] == {parts[1]: [[100, end]]} and again.rows == 20
    got = committed_offsets(out, s3)
    assert len(got) == len(set(got)) == 620  # every message once: none of [100, end) twice


def test_an_abort_after_a_completed_range_leaves_that_object_alone(
    broker: BrokerSettings, streams: StreamFactory, s3: S3Server
) -> None:
    """Found by the campaign's S3 outputs (`make campaign`, seed 1223547691): a run whose lease was
    taken over while it was in its sink failed at its next range and aborted the sink, which removed
    the object of the range it had last *completed*. On an object store that is the range's final
    name, and the run that took the lease over (the same token, so the same names) had committed
    it: the committed manifest then named a missing object (`FileNotFoundError` for every reader).
    An abort removes only the range still being written."""
    out = f"s3://{s3.new_bucket()}/abort"
    sink = consume.ParquetSink(out, storage_options=s3.storage_options())
    schema = pa.schema([("value", pa.binary())])
    sink.open("orders-0", 0, 2, schema)
    sink.write(pa.record_batch([pa.array([b"a", b"b"])], schema=schema))
    sink.close()
    sink.abort()  # the run failed after the range: its object stays for whoever commits it
    assert s3.keys(out.removeprefix("s3://").split("/")[0]) == [f"abort/{sink.written[0]}"]
    sink.open("orders-1", 0, 1, schema)
    sink.write(pa.record_batch([pa.array([b"c"])], schema=schema))
    sink.abort()  # inside a range: what it left is removed
    assert s3.keys(out.removeprefix("s3://").split("/")[0]) == [f"abort/{sink.written[0]}"]


def test_an_abort_inside_a_range_leaves_the_final_name_another_try_committed(s3: S3Server) -> None:
    """The other half of the campaign's finding (seed 1223547691): the run whose lease was taken
    over was *inside* a range when it failed. Its final name had been written and committed by the
    run that took over (the same token). Closing the aborted writer completed its upload (pyarrow
    cannot abandon one), replacing that object with a partial one, and the abort then deleted it.
    Now each try writes under its own name until the range is complete: the committed object is
    left whole."""
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/inside"
    schema = pa.schema([("value", pa.binary())])
    winner = consume.ParquetSink(out, storage_options=s3.storage_options())
    winner.open("orders-0", 0, 3, schema)
    winner.write(pa.record_batch([pa.array([b"a", b"b", b"c"])], schema=schema))
    winner.close()
    zombie = consume.ParquetSink(out, storage_options=s3.storage_options())  # the same range, token None
    zombie.open("orders-0", 0, 3, schema)
    zombie.write(pa.record_batch([pa.array([b"a"])], schema=schema))
    zombie.abort()  # its lease is gone: it fails inside the range
    assert s3.keys(bucket) == [f"inside/{winner.written[0]}"]
    import pyarrow.parquet as pq

    table = pq.read_table(f"{bucket}/inside/{winner.written[0]}", filesystem=s3.pyarrow_fs())
    assert table.column("value").to_pylist() == [b"a", b"b", b"c"]
