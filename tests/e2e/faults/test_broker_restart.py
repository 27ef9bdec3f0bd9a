"""The broker restarted (a real process restart) in the middle of a batch read, a streaming query
and a write: reads resume where they stopped, writes re-send what was unconfirmed, nothing is lost
and, with a producer name, nothing is duplicated."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs.broker import recovery
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings, read_range
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.codec import encode
from pyspark_rmqs.errors import BrokerUnavailableError, PublishError
from tests.e2e.faults.support import (
    RestartWhen,
    SteadyProducer,
    assert_exact,
    broker_down,
    broker_up,
    wait_for,
)
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _paced(rows: int, delay_s: float, started: Path):  # type: ignore[no-untyped-def]
    """A mapInArrow function passing `rows` rows per `delay_s`, so the job still runs when the fault
    hits (a graceful broker stop takes ~7 s); it creates `started` when the first rows pass."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time as t

        for b in batches:
            for i in range(0, b.num_rows, rows):
                started.touch()
                t.sleep(delay_s)
                yield b.slice(i, rows)

    return fn


def _rows(df) -> list[tuple[str, int, bytes]]:  # type: ignore[no-untyped-def]
    return [(r.stream, r.offset, bytes(r.value)) for r in df.collect()]


@pytest.mark.spark
def test_batch_read_resumes_after_broker_restart(
    spark: SparkSession, restartable: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fr")
    # 120 MB: more than the sockets and Spark buffer between the reader and the paced consumer.
    bodies = [f"r{i:07d}".ljust(1000, ".").encode() for i in range(120_000)]
    publish(restartable, s, bodies, batch=5000)
    df = (
        spark.read.format("rabbitmq_streams")
        .options(**spark_options(restartable, stream=s, metadataFields="", minPartitions="2"))
        .load()
        .select("stream", "offset", "value")
    )
    started = tmp_path / "started"
    slow = df.mapInArrow(_paced(2000, 0.5, started), df.schema)  # 15 s per partition
    fault = RestartWhen(started.exists)
    fault.start()
    rows = _rows(slow)
    done_at = time.monotonic()
    fault.check()
    assert fault.down_at is not None and done_at > fault.down_at, "the read ended before the broker went down"
    assert_exact(rows, {s: bodies})


@pytest.mark.spark
def test_batch_write_resends_unconfirmed_after_broker_restart(
    spark: SparkSession, restartable: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fw")
    n = 60_000
    df = spark.range(0, n, numPartitions=1).selectExpr("format_string('w%07d', id) as value")
    started = tmp_path / "started"
    slow = df.mapInArrow(_paced(500, 0.12, started), df.schema)  # 15 s
    fault = RestartWhen(started.exists)
    fault.start()
    (
        slow.write.format("rabbitmq_streams")
        .options(**spark_options(restartable, stream=s, producerName="fw", batchSize="100"))
        .mode("append")
        .save()
    )
    done_at = time.monotonic()
    fault.check()
    assert fault.down_at is not None and done_at > fault.down_at, "the write ended before the restart"
    tail = client(restartable).tail(s)
    got = read_range(conn_of(restartable), s, 0, tail).column("value").to_pylist()
    # One writer, a producer name: the broker dropped what it already had; nothing twice, nothing lost.
    assert got == [f"w{i:07d}".encode() for i in range(n)]


@pytest.mark.spark
def test_streaming_query_and_producer_ride_out_broker_restart(
    spark: SparkSession, restartable: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    ss, parts = streams.super_stream(3, "fs")
    producer = SteadyProducer(restartable, ss, superstream=True, rate=3000, name="fs-producer")
    producer.start()
    q = (
        spark.readStream.format("rabbitmq_streams")
        .options(**spark_options(restartable, superstream=ss, metadataFields="", maxRecordsPerTrigger="2000"))
        .load()
        .select("stream", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: q.lastProgress and q.lastProgress["numInputRows"] > 0, 120, "a first batch")
        broker_down()
        time.sleep(2)
        broker_up()
        time.sleep(3)  # the producer and the query carry on after the restart
        sent = producer.finish()
        c = client(restartable)
        tails = c.tails(parts)
        assert sum(tails.values()) == len(sent), "the producer's stream holds other than what it sent"

        def caught_up() -> bool:
            p = q.lastProgress
            if q.exception() is not None:
                raise AssertionError(f"the query failed: {q.exception()}")
            if not p:
                return False
            end = p["sources"][0]["endOffset"]
            end = json.loads(end) if isinstance(end, str) else end
            return all(int(end.get(s, -1)) >= t for s, t in tails.items())

        wait_for(caught_up, 180, "the query to catch up", every_s=0.5)
    finally:
        q.stop()
    assert q.exception() is None
    rows = _rows(spark.read.parquet(str(tmp_path / "out")))
    conn = conn_of(restartable)
    expected = {p: read_range(conn, p, 0, tails[p]).column("value").to_pylist() for p in parts}
    assert sum(len(v) for v in expected.values()) == len(sent)
    assert sorted(x for v in expected.values() for x in v) == sorted(sent)
    assert_exact(rows, expected)


def test_reader_fails_loudly_when_the_broker_stays_down(
    restartable: BrokerSettings, streams, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fd")
    publish(restartable, s, [b"x"] * 10_000)
    monkeypatch.setattr(recovery, "RECOVERY_WINDOW_S", 3.0)
    monkeypatch.setattr("pyspark_rmqs.broker.reader.RECOVERY_WINDOW_S", 3.0)
    reader = iter(RangeReader(conn_of(restartable), s, 0, 20_000, ReadSettings(batch_rows=1000)))
    first = next(reader)
    assert 0 < first.num_rows < 10_000  # the range is not read to its end yet
    broker_down()
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError, match=r"could not resume reading '.*' at offset \d+"):
            for _ in reader:
                pass
        assert time.monotonic() - started < 30
    finally:
        broker_up()


def test_writer_fails_loudly_when_the_broker_stays_down(
    restartable: BrokerSettings, streams, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fd")
    monkeypatch.setattr(recovery, "RECOVERY_WINDOW_S", 3.0)
    monkeypatch.setattr("pyspark_rmqs.broker.writer.RECOVERY_WINDOW_S", 3.0)
    settings = WriteSettings(producer_name="fd", resume_sequence=False)
    p = StreamProducer(conn_of(restartable), s, superstream=False, settings=settings)
    try:
        p.send([encode(b"a%d" % i) for i in range(1000)])
        p.flush()
        broker_down()
        try:
            started = time.monotonic()
            gone = r"did not come back within 3 s: \d+ message\(s\) unconfirmed"
            with pytest.raises(PublishError, match=gone):
                p.send([encode(b"b%d" % i) for i in range(1000)])
                p.flush()
            assert time.monotonic() - started < 30
        finally:
            broker_up()
    finally:
        p.close()
    # What was confirmed before the broker went down is there, once.
    got = read_range(conn_of(restartable), s, 0, client(restartable).tail(s)).column("value").to_pylist()
    assert got[:1000] == [b"a%d" % i for i in range(1000)]
