"""The broker restarted (a real process restart) in the middle of a batch read, a streaming query
and a write: reads resume where they stopped, writes re-send what was unconfirmed, nothing is lost
and, with a producer name, nothing is duplicated.

The broker these tests restart is the second local one (`restartable_broker`): `broker` below is
it, so `streams` makes their streams there, and the tests other workers run meanwhile never see it
go down."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs import consume, jobs
from pyspark_rmqs.broker import recovery
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings, read_range
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode
from pyspark_rmqs.core.errors import BrokerUnavailableError, PublishError
from pyspark_rmqs.errors import LeaseLostError, classify
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.watermarks import watermarks
from tests.e2e.faults.support import (
    RestartWhen,
    SteadyProducer,
    assert_exact,
    broker_down,
    broker_pids,
    broker_up,
    paced,
    wait_for,
)
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish, spark_options

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture
def broker(restartable_broker: BrokerSettings) -> BrokerSettings:
    return restartable_broker


def _rows(df) -> list[tuple[str, int, bytes]]:  # type: ignore[no-untyped-def]
    return [(r.stream, r.offset, bytes(r.value)) for r in df.collect()]


class SubscriptionWatch(threading.Thread):
    """Polls the broker's management API for the subscriptions on `streams`, noting when each poll
    was sent. The broker forgets every subscription when it stops, so a subscription listed by a
    poll sent after the broker went down was made after the restart: a reader subscribed again."""

    def __init__(self, b: BrokerSettings, streams: list[str]) -> None:
        super().__init__(daemon=True, name="subscription-watch")
        self.b, self.streams = b, set(streams)
        self.sightings: list[tuple[float, str, int]] = []  # (poll sent at, stream, offset reached)
        self.stop_event = threading.Event()

    def poll(self) -> list[dict[str, Any]]:
        req = urllib.request.Request(f"http://{self.b.host}:{self.b.management_port}/api/stream/consumers")
        token = base64.b64encode(f"{self.b.username}:{self.b.password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(req, timeout=5) as answer:
            return list(json.load(answer))

    def run(self) -> None:
        while not self.stop_event.is_set():
            sent = time.monotonic()
            try:
                consumers = self.poll()
            except (OSError, ValueError):  # the broker is down or starting
                consumers = []
            for c in consumers:
                stream = c.get("queue", {}).get("name")
                if stream in self.streams:
                    self.sightings.append((sent, stream, int(c["offset"])))
            self.stop_event.wait(0.1)

    def listed_after(self, t: float) -> list[tuple[str, int]]:
        """(stream, offset) of the subscriptions listed by polls sent after `t`."""
        self.stop_event.set()
        self.join(30)
        return sorted({(stream, offset) for sent, stream, offset in self.sightings if sent > t})


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
        .options(
            **spark_options(restartable, stream=s, metadataFields="", minPartitions="2", queueCapacity="500")
        )
        .load()
        .select("stream", "offset", "value")
    )
    started = tmp_path / "started"
    slow = df.mapInArrow(paced(1000, 0.5, started), df.schema)  # 30 s per partition
    fault = RestartWhen(started.exists)
    watch = SubscriptionWatch(restartable, [s])
    watch.start()
    fault.start()
    rows = _rows(slow)
    done_at = time.monotonic()
    fault.check()
    assert fault.down_at is not None and done_at > fault.down_at, "the read ended before the broker went down"
    # Proof that the executors' readers resubscribed (not that everything was buffered before the
    # restart): the broker lists subscriptions made after it went down. Local Spark never retries a
    # task, so these are readers resubscribing. (Both splits usually show; the management API
    # samples every few seconds, so a split whose reader caught up quickly can be missed.)
    after = watch.listed_after(fault.down_at)
    assert after, "no reader subscribed again after the restart"
    assert all(0 <= offset < 120_000 for _, offset in after), after[:5] + after[-5:]
    assert_exact(rows, {s: bodies})


def test_range_reader_resubscribes_once_after_broker_restart(
    restartable: BrokerSettings, streams, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """In process, so the resubscription is counted from the reader's own log: exactly one."""
    s = streams.stream("fi")
    # 20 MB in 5,000-message chunks: far more than the reader's queue (500 messages, so one chunk in
    # flight) and the sockets hold, so most of the range is still on the broker when it restarts.
    n = 200_000
    bodies = [f"i{i:06d}".ljust(100, ".").encode() for i in range(n)]
    publish(restartable, s, bodies, batch=5000)
    caplog.set_level(logging.WARNING, logger="pyspark_rmqs.broker.reader")
    reader = RangeReader(conn_of(restartable), s, 0, n, ReadSettings(batch_rows=500, queue_capacity=500))
    it = iter(reader)
    got = next(it).column("value").to_pylist()
    assert 0 < len(got) < n
    broker_down()
    broker_up()
    for batch in it:
        got.extend(batch.column("value").to_pylist())
    assert got == bodies, "every message once, in order"
    resubscribed = [
        r for r in caplog.records if "resubscribing" in r.getMessage() and f"'{s}'" in r.getMessage()
    ]
    assert len(resubscribed) == 1, resubscribed


@pytest.mark.spark
def test_batch_write_resends_unconfirmed_after_broker_restart(
    spark: SparkSession, restartable: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("fw")
    n = 60_000
    df = spark.range(0, n, numPartitions=1).selectExpr("format_string('w%07d', id) as value")
    started = tmp_path / "started"
    slow = df.mapInArrow(paced(500, 0.12, started), df.schema)  # 15 s
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
        # Everything at or past these tails was published after the restart: the broker forgot every
        # subscription when it stopped, so reading it proves the readers subscribed again.
        after_restart = client(restartable).tails(parts)
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
    # Every partition got messages after the restart and the query read them: new subscriptions.
    # (The broker's management API samples statistics every few seconds, too slowly to list a
    # micro-batch's subscriptions, which live for milliseconds.)
    for p in parts:
        assert tails[p] > after_restart[p], f"the producer published nothing to {p} after the restart"
        assert any(s == p and o >= after_restart[p] for s, o, _ in rows), (
            f"{p} was not read after the restart"
        )
    conn = conn_of(restartable)
    expected = {p: read_range(conn, p, 0, tails[p]).column("value").to_pylist() for p in parts}
    assert sum(len(v) for v in expected.values()) == len(sent)
    assert sorted(x for v in expected.values() for x in v) == sorted(sent)
    assert_exact(rows, expected)


@pytest.mark.parametrize("producer_name", [None, "crash"], ids=["no-producerName", "producerName"])
def test_a_write_re_sends_its_unconfirmed_frames_after_a_broker_crash(
    restartable: BrokerSettings, streams, caplog: pytest.LogCaptureFixture, producer_name: str | None
) -> None:  # type: ignore[no-untyped-def]
    """A producer with up to 1,000 messages in flight: 5,000 confirmed, then the broker frozen
    (SIGSTOP) while 1,000 more are sent, killed (SIGKILL) and started again. (A graceful stop confirms
    what it stored before it closes, which leaves nothing to re-send.) The producer reconnects and
    re-sends its unconfirmed frames, in order, with their publishing ids: the stream holds every
    message in order of first appearance (never a gap); without a producer name the broker keeps
    what it had stored of them again (at most one repeat per re-sent frame, fewer than one confirm
    window), with one it drops those: every message once."""
    s = streams.stream("fn")
    window = 1000
    sent = [f"n{i:06d}".encode() for i in range(20_000)]
    caplog.set_level(logging.WARNING, logger="pyspark_rmqs.broker.publisher")
    settings = WriteSettings(max_in_flight=window, producer_name=producer_name, resume_sequence=False)
    with StreamProducer(conn_of(restartable), s, superstream=False, settings=settings) as p:
        p.send([encode(b) for b in sent[:5000]])
        p.flush()
        pids = broker_pids()
        assert pids, "the broker's processes are not on this machine"
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            for i in range(5000, 6000, 100):  # in the socket, never read: unconfirmed
                p.send([encode(b) for b in sent[i : i + 100]])
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        finally:
            broker_up()
        for i in range(6000, len(sent), 1000):
            p.send([encode(b) for b in sent[i : i + 1000]])
        p.flush()
    got = read_range(conn_of(restartable), s, 0, client(restartable).tail(s)).column("value").to_pylist()
    assert list(dict.fromkeys(got)) == sent, "a message is missing or out of order"
    resent = [
        int(m.group(1))
        for r in caplog.records
        if (m := re.search(r"re-sent (\d+) unconfirmed", r.getMessage()))
    ]
    assert resent and resent[0] > 0, f"nothing was re-sent: {[r.getMessage() for r in caplog.records]}"
    repeats = len(got) - len(sent)
    assert 0 <= repeats <= min(resent[0], window), (
        f"{repeats} repeats for {resent[0]} re-sent (window {window})"
    )
    if producer_name:
        assert got == sent, f"{repeats} repeats with a producer name"


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


# A Spark-free watermark run (`consume.run_consume`: what the Airflow consume operator and a Dagster
# `engine="arrow"` asset run), 200,000 messages of 100 B read 500 at a time: most of the range is
# still on the broker when the sink restarts or stops it after the first batch.
RUN_N = 200_000


def _run_bodies() -> list[bytes]:
    return [f"o{i:06d}".ljust(100, ".").encode() for i in range(RUN_N)]


def _small_batches(b: BrokerSettings, plan: Any) -> Any:
    """The run's reader settings with a 500-message queue (one chunk in flight)."""
    return consume.read_settings(conn_of(b), plan, source_options={"queueCapacity": "500"})


def test_a_watermark_run_rides_out_a_broker_restart(restartable: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    """The broker restarted once the run's sink has its first batch, while the run reads on (its sink
    slowed down until the broker is back): the reader waits for the broker and resubscribes at its
    next offset, the run takes its lease back (the broker forgot it; the record pointer is as the run
    left it) and finishes on its first try: every offset once in its sink, the watermark at the tail,
    the record `stored`.

    The lease is taken back as long as the reader waits for the broker (the recovery window, 60 s),
    not only the lease wait (10 s, for a run holding the name): a restart of 8-15 s used to outlast
    the lease wait when the run handed on a batch its reader had buffered, and the run failed with
    `LeaseLostError`. This run has the default lease wait."""
    s = streams.stream("wr")
    bodies = _run_bodies()
    publish(restartable, s, bodies, batch=5000)
    conn = conn_of(restartable)
    plan = jobs.plan_read(conn, stream=s, consumer="rides")
    got: list[bytes] = []
    fault = RestartWhen(lambda: got)

    def sink(batch: Any) -> None:
        got.extend(batch.column("value").to_pylist())
        # The first batch is held until the broker is down (its stop takes seconds, longer on a busy
        # machine: a run that went on meanwhile could end first), then 10,000 messages a second
        # until it is back.
        deadline = time.monotonic() + 120
        while fault.down_at is None and fault.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if fault.up_at is None:
            time.sleep(0.05)

    fault.start()
    summary = consume.run_consume(conn, plan, sink, settings=_small_batches(restartable, plan))
    done_at = time.monotonic()
    fault.check()
    assert fault.down_at is not None and done_at > fault.down_at, "the run ended before the broker went down"
    assert summary.rows == RUN_N and summary.watermark_stored
    assert got == bodies, "every message once, in order"
    assert plan.lease is not None and plan.lease.regained == 1, "the run did not take its lease back"
    assert watermarks(conn, "rides", stream=s).partitions[0].stored == RUN_N - 1
    record = run_record.latest(conn, "rides", s)
    assert record is not None and record.done


def test_a_watermark_run_fails_when_the_broker_stays_down_and_its_retry_reads_the_same_range(
    restartable: BrokerSettings, streams, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The broker stopped from inside the run's sink and kept down: the run fails, retryable, having
    committed nothing (`before_commit`), and leaves the watermark where it was: with
    `LeaseLostError` when it hands on a batch its reader had buffered and cannot take its lease back
    within the lease wait (10 s), or with `BrokerUnavailableError` when its reader waited out the
    recovery window (3 s here, 60 s by default) first. With the broker back, its retry resumes the
    record and reads exactly the same range: every offset once in the retry's sink."""
    s = streams.stream("wd")
    bodies = _run_bodies()
    publish(restartable, s, bodies, batch=5000)
    conn = conn_of(restartable)
    monkeypatch.setattr(recovery, "RECOVERY_WINDOW_S", 3.0)
    monkeypatch.setattr("pyspark_rmqs.broker.reader.RECOVERY_WINDOW_S", 3.0)
    plan = jobs.plan_read(conn, stream=s, consumer="down")
    first: list[bytes] = []

    def sink(batch: Any) -> None:
        if not first:
            broker_down()
        first.extend(batch.column("value").to_pylist())

    try:
        started = time.monotonic()
        with pytest.raises((BrokerUnavailableError, LeaseLostError)) as failed:
            consume.run_consume(conn, plan, sink, settings=_small_batches(restartable, plan))
        assert time.monotonic() - started < 60
    finally:
        broker_up()
    c = classify(failed.value)
    assert c.retryable and c.commit_state == "before_commit"
    assert 0 < len(first) < RUN_N and first == bodies[: len(first)]
    monkeypatch.undo()  # the retry gets the default window
    assert watermarks(conn, "down", stream=s).partitions[0].stored is None, (
        "the failed run moved the watermark"
    )
    retry = jobs.plan_read(conn, stream=s, consumer="down")
    assert retry.resumed and retry.ranges == plan.ranges
    again: list[bytes] = []
    summary = consume.run_consume(conn, retry, lambda b: again.extend(b.column("value").to_pylist()))
    assert again == bodies and summary.watermark_stored
    assert watermarks(conn, "down", stream=s).partitions[0].stored == RUN_N - 1


def test_a_time_past_every_chunk_has_not_passed_after_a_broker_restart(
    restartable: BrokerSettings, streams, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """After a restart, RabbitMQ 4.0 attached a subscription at a time past every chunk of a stream
    with small segments to the first chunk of its last segment, older than the time: rmqs took that
    for "the broker's clock passed it", so an Airflow interval still open was read as closed (its
    late messages in neither run) and a Dagster window likewise (found by the campaign). The time
    has not passed; the interval ending then is refused (`OpenWindowError`, retryable)."""
    from datetime import UTC, datetime, timedelta

    from airflow_rmqs.plain_operators import RabbitMQStreamConsumeOperator
    from pyspark_rmqs.broker.client import BrokerClient
    from pyspark_rmqs.errors import OpenWindowError

    s = streams.stream("tb", arguments={"stream-max-segment-size-bytes": 400})
    conn = conn_of(restartable)
    for i in range(5):
        publish(restartable, s, [f"m{i}-{j}".encode() for j in range(10)])
    # A consumer's stored offset: the broker starts its segments with a snapshot of them.
    BrokerClient(conn).store_offsets("a-consumer", {s: 3})
    broker_down()
    broker_up()
    c = BrokerClient(conn, patient=True)
    wait_for(lambda: c.tail(s) == 50, 60, "the stream back after the restart")
    time.sleep(2)  # as a scheduled run would come later
    later = datetime.now(UTC) + timedelta(seconds=20)
    bound = c.time_bounds([s], [int(later.timestamp() * 1000)])[s][0]
    assert not bound.passed, f"a time 20 s ahead passed on the broker's clock: {bound}"
    monkeypatch.setenv("AIRFLOW_CONN_RMQS_RESTARTED", restartable.uri)
    rows: list[Any] = []
    with pytest.raises(Exception) as refused:
        RabbitMQStreamConsumeOperator(
            task_id="interval",
            rabbitmq_stream_conn_id="rmqs_restarted",
            stream=s,
            start=(later - timedelta(hours=1)).isoformat(),
            end=later.isoformat(),
            apply_function=rows.append,
        ).execute({})
    assert classify(refused.value).error == OpenWindowError.__name__ and not rows
