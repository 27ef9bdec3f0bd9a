"""Read-side guarantees under real faults, counting every offset of every range.

Retention truncates streams during reads (small segments and a byte-retention policy make it
deterministic), streams are deleted mid-read, the broker is paused with SIGSTOP for longer than
the probe timeout, runs fail between the sink and the watermark, and two runs share a consumer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.errors import PySparkException

from pyspark_rmqs import jobs
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.core.codec import encode
from pyspark_rmqs.core.errors import BrokerUnavailableError, DataLossError
from pyspark_rmqs.runs import steps
from pyspark_rmqs.runs.watermarks import store_watermarks, watermarks
from tests.conftest import StreamFactory
from tests.integration.test_spark_streaming import drain
from tests.support.broker import BrokerSettings, management
from tests.support.data import client, conn_of, publish, settled_bounds

# 1 KiB messages, 50 KB segments, 400 KB retained: about 50 messages per segment, 8 segments kept.
# 400 messages of ~1 KB with their encoding and chunk headers are ~412 KB: a 400,000-byte limit let
# retention remove the first segment before the first read (a flake: the first drain began at 50).
RETENTION = {"max-length-bytes": 450_000, "stream-max-segment-size-bytes": 50_000}
BODY_PAD = b"x" * 990


def _publish_chunks(broker: BrokerSettings, stream: str, tag: bytes, n: int, per_chunk: int) -> None:
    """`n` ~1 KiB messages, one broker chunk per `per_chunk` (each send is flushed on its own)."""
    with StreamProducer(conn_of(broker), stream, superstream=False, settings=WriteSettings()) as p:
        for i in range(0, n, per_chunk):
            p.send([encode(tag + b"%06d" % j + BODY_PAD) for j in range(i, min(n, i + per_chunk))])
            p.flush()


def _offsets(batches: Iterator[Any]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


@pytest.fixture
def truncating(broker: BrokerSettings, streams: StreamFactory) -> str:
    """A stream holding offsets [0, 400) in 8 segments, that 1,000 more messages truncate past 1000."""
    s = streams.stream("ret", arguments=dict(RETENTION))
    _publish_chunks(broker, s, b"a", 400, 5)
    assert client(broker).bounds([s])[s] == (0, 400)
    return s


@pytest.mark.parametrize("fail", [True, False])
def test_retention_during_a_range_read_is_data_loss_never_a_silent_skip(
    broker: BrokerSettings, truncating: str, fail: bool, caplog: pytest.LogCaptureFixture
) -> None:
    s = truncating
    reader = RangeReader(
        conn_of(broker), s, 0, 400, ReadSettings(batch_rows=5, queue_capacity=5, fail_on_data_loss=fail)
    )
    it = iter(reader)
    first = next(it).column("offset").to_pylist()
    assert first == [0, 1, 2, 3, 4]
    _publish_chunks(broker, s, b"b", 1000, 50)  # retention now removes every segment of the range
    first_left, tail = client(broker).bounds([s])[s]
    assert first_left > 400 and tail == 1400
    if fail:
        with pytest.raises(DataLossError) as lost:
            _offsets(it)
        text = str(lost.value)
        # The broker finishes the segment it has open (about 50 messages), then skips to what is left.
        assert f"of stream '{s}' are lost" in text and ", 400) of stream" in text
        assert "failOnDataLoss=false" in text
        return
    got = first + _offsets(it)
    read_to = len(got)
    assert 5 <= read_to < 400
    assert got == list(range(read_to))  # every offset read is in order, once
    assert reader.lost == [(read_to, 400)]  # and every other offset of the range is accounted for
    assert f"offsets [{read_to}, 400) of stream '{s}' are lost" in caplog.text


@pytest.mark.parametrize("fail", [True, False])
def test_retention_between_planning_and_the_spark_read(
    spark: Any, broker: BrokerSettings, truncating: str, fail: bool, tmp_path: Any
) -> None:
    """A plan made before retention struck reads nothing silently: the executors check the gap."""
    s = truncating
    conn = conn_of(broker)
    plan = jobs.plan_read(conn, stream=s, start="earliest", end="latest", fail_on_data_loss=fail)
    assert plan.ranges == {s: (0, 400)}
    _publish_chunks(broker, s, b"b", 1000, 50)
    out = tmp_path / "out"
    if fail:
        with pytest.raises(Exception) as failed:
            jobs.run_read(spark, conn, plan, jobs.write_output(str(out)), store_watermark=False)
        # The source's own planning finds it first: offsets [0, first) are gone.
        assert "DataLossError: offsets [0, " in str(failed.value)
        assert f"of stream '{s}' are lost" in str(failed.value)
        return
    summary = jobs.run_read(spark, conn, plan, jobs.write_output(str(out)), store_watermark=False)
    assert summary.rows == 0  # every offset of [0, 400) was gone before the executor subscribed
    assert summary.extra["data_loss"] == {s: [0, 400]}


@pytest.mark.parametrize("fail", [True, False])
def test_a_stream_deleted_mid_read_follows_fail_on_data_loss(
    broker: BrokerSettings, streams: StreamFactory, fail: bool
) -> None:
    s = streams.stream("del")
    _publish_chunks(broker, s, b"a", 400, 5)
    reader = RangeReader(
        conn_of(broker), s, 0, 400, ReadSettings(batch_rows=5, queue_capacity=5, fail_on_data_loss=fail)
    )
    it = iter(reader)
    first = next(it).column("offset").to_pylist()
    client(broker).delete_stream(s)
    if fail:
        with pytest.raises(DataLossError) as lost:
            _offsets(it)
        assert f"of stream '{s}' are lost" in str(lost.value)
        assert "deleted" in str(lost.value)
        return
    got = first + _offsets(it)
    # What was read is a prefix in order; the rest of the range is reported lost, nothing in between.
    assert got == list(range(len(got)))
    assert reader.lost == [(len(got), 400)]


# ----------------------------------------------------------------- the watermark protocol (jobs)


def _collecting_sink(store: list[list[int]], fail_first: Any = None) -> Any:
    def sink(df: Any) -> None:
        store.append(sorted(r.offset for r in df.select("offset").collect()))
        if len(store) == 1 and fail_first is not None:
            fail_first()

    return sink


def test_a_retry_reads_the_recorded_plan_even_after_new_data(
    spark: Any, broker: BrokerSettings, streams: StreamFactory
) -> None:
    s = streams.stream("plan")
    conn = conn_of(broker)
    publish(broker, s, [f"a{i}".encode() for i in range(600)])
    seen: list[list[int]] = []

    def late_data_then_fail() -> None:
        publish(broker, s, [f"b{i}".encode() for i in range(100)])
        raise BrokerUnavailableError("the sink's commit failed (simulated)")

    plan = jobs.plan_read(conn, stream=s, consumer="plan")
    assert plan.ranges == {s: (0, 600)} and not plan.resumed
    with pytest.raises(BrokerUnavailableError):
        jobs.run_read(spark, conn, plan, _collecting_sink(seen, late_data_then_fail))
    assert watermarks(conn, "plan", stream=s).partitions[0].stored is None
    retry = jobs.plan_read(conn, stream=s, consumer="plan", max_messages=50)
    assert retry.resumed and retry.ranges == {s: (0, 600)}  # not [0, 700), and not capped anew
    jobs.run_read(spark, conn, retry, _collecting_sink(seen))
    assert seen == [list(range(600)), list(range(600))]
    nxt = jobs.plan_read(conn, stream=s, consumer="plan")
    # Offsets 600 and 601 hold the recorded plan (tracking entries); the 100 late messages follow.
    tail = client(broker).tail(s)
    assert not nxt.resumed and nxt.ranges == {s: (600, tail)}
    jobs.run_read(spark, conn, nxt, _collecting_sink(seen))
    assert seen[-1] == list(range(tail - 100, tail))


def test_a_failure_between_the_sink_and_the_store_rereads_the_same_range(
    spark: Any, broker: BrokerSettings, streams: StreamFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the record says `delivered`, a retry delivers the same range again (at-least-once);
    after it, a retry only stores: the sink never sees the range a third time."""
    from pyspark_rmqs.runs import record as run_record

    s = streams.stream("store")
    conn = conn_of(broker)
    publish(broker, s, [f"a{i}".encode() for i in range(300)])
    seen: list[list[int]] = []
    plan = jobs.plan_read(conn, stream=s, consumer="st")
    real_advance, real_store = run_record.advance, steps.store_watermarks_checked

    def lost(*a: Any, **k: Any) -> None:
        publish(broker, s, [f"b{i}".encode() for i in range(30)])
        raise BrokerUnavailableError("connection lost after the sink (simulated)")

    monkeypatch.setattr(run_record, "advance", lost)  # dies before the record says delivered
    with pytest.raises(BrokerUnavailableError):
        jobs.run_read(spark, conn, plan, _collecting_sink(seen))
    monkeypatch.setattr(run_record, "advance", real_advance)
    monkeypatch.setattr(steps, "store_watermarks_checked", lost)  # delivered, then the store fails
    retry = jobs.plan_read(conn, stream=s, consumer="st")
    assert retry.resumed and retry.ranges == {s: (0, 300)}
    with pytest.raises(BrokerUnavailableError) as e:
        jobs.run_read(spark, conn, retry, _collecting_sink(seen))
    assert getattr(e.value, "commit_state", None) == "committed"
    assert seen == [list(range(300))] * 2  # at-least-once: the same offsets, once more
    monkeypatch.setattr(steps, "store_watermarks_checked", real_store)
    last = jobs.plan_read(conn, stream=s, consumer="st")
    assert last.resumed and last.delivered and last.ranges == {s: (0, 300)}
    summary = jobs.run_read(spark, conn, last, _collecting_sink(seen))
    assert summary.extra["sink_skipped"] and seen == [list(range(300))] * 2  # only stored
    assert watermarks(conn, "st", stream=s).partitions[0].stored == 299


def test_a_second_run_on_one_consumer_fails_before_it_reads(
    spark: Any, broker: BrokerSettings, streams: StreamFactory
) -> None:
    """The lease: while a run holds its consumer name, another fails with ConsumerBusyError before
    reading anything; once the first ended (or its process died), the next run plans after it."""
    from pyspark_rmqs.core.errors import ConsumerBusyError

    s = streams.stream("conc")
    conn = conn_of(broker)
    publish(broker, s, [f"a{i}".encode() for i in range(200)])
    slow = jobs.plan_read(conn, stream=s, consumer="cc", pipeline="dag/slow")
    seen: list[list[int]] = []
    with pytest.raises(ConsumerBusyError) as busy:
        jobs.plan_read(conn, stream=s, consumer="cc", lease_wait_s=1)
    assert "consumer 'cc'" in str(busy.value) and "pipeline 'dag/slow'" in str(busy.value)
    assert busy.value.retryable
    jobs.run_read(spark, conn, slow, _collecting_sink(seen))
    publish(broker, s, [f"b{i}".encode() for i in range(100)])
    second = jobs.plan_read(conn, stream=s, consumer="cc", lease_wait_s=1)
    jobs.run_read(spark, conn, second, _collecting_sink(seen))
    # Every message once (offset-tracking entries between the two batches take offsets too).
    assert seen[0] == list(range(200)) and len(seen) == 2
    assert len(seen[1]) == 100 and seen[1] == list(range(seen[1][0], seen[1][0] + 100)) and seen[1][0] >= 200
    assert watermarks(conn, "cc", stream=s).partitions[0].stored == seen[1][-1]


def test_a_watermark_moved_by_hand_makes_the_pending_plan_stale(
    spark: Any, broker: BrokerSettings, streams: StreamFactory
) -> None:
    s = streams.stream("hand")
    conn = conn_of(broker)
    publish(broker, s, [f"a{i}".encode() for i in range(100)])
    jobs.plan_read(conn, stream=s, consumer="hd").release()  # recorded [0, 100), never run
    store_watermarks(conn, "hd", {s: 49})  # an operator resets the watermark
    plan = jobs.plan_read(conn, stream=s, consumer="hd")
    assert not plan.resumed and plan.ranges == {s: (50, 100)}


def test_backfills_neither_read_nor_touch_the_recorded_plan(
    spark: Any, broker: BrokerSettings, streams: StreamFactory
) -> None:
    s = streams.stream("bf")
    conn = conn_of(broker)
    publish(broker, s, [f"a{i}".encode() for i in range(100)])
    live = jobs.plan_read(conn, stream=s, consumer="bf")
    live.release()  # the run dies here: its record stays
    backfill = jobs.plan_read(conn, stream=s, consumer="bf", start={s: 10}, end={s: 20})
    assert not backfill.resumed and backfill.ranges == {s: (10, 20)}
    jobs.run_read(spark, conn, backfill, _collecting_sink([]), store_watermark=False)
    again = jobs.plan_read(conn, stream=s, consumer="bf")
    assert again.resumed and again.ranges == live.ranges == {s: (0, 100)}


# ----------------------------------------------------------------------------- streaming reads


def _rows(spark: Any, out: Any) -> list[tuple[str, int, bytes]]:
    return sorted((r.stream, r.offset, bytes(r.value)) for r in spark.read.parquet(str(out)).collect())


def test_a_partition_added_to_a_super_stream_between_micro_batches_is_read_from_its_start(
    spark: Any, broker: BrokerSettings, streams: StreamFactory, tmp_path: Any
) -> None:
    if broker.external:
        pytest.skip("binds a partition through the local broker's management API")
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(50)])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = drain(spark, broker, out, ckpt, superstream=name, maxRecordsPerTrigger="40")
    assert q.exception() is None, q.exception()
    added = f"{name}-2"
    streams._streams.append(added)  # deleted at teardown with the others
    tb_run_create(broker, added)
    management(
        "POST",
        f"bindings/%2F/e/{name}/q/{added}",
        {"routing_key": "2", "arguments": {"x-stream-partition-order": 2}},
    )
    assert client(broker).partitions(name) == [*parts, added]
    publish(broker, added, [f"{added}:{i}".encode() for i in range(30)])
    q = drain(spark, broker, out, ckpt, superstream=name, maxRecordsPerTrigger="40")
    assert q.exception() is None, q.exception()
    got = _rows(spark, out)
    for p, n in ((parts[0], 50), (parts[1], 50), (added, 30)):
        assert [(o, v) for s, o, v in got if s == p] == [(i, f"{p}:{i}".encode()) for i in range(n)]


def tb_run_create(broker: BrokerSettings, stream: str) -> None:
    from tests.support import broker as tb

    tb.run(tb.create_stream(broker, stream))


def test_retention_between_available_now_drains_of_one_checkpoint(
    spark: Any, broker: BrokerSettings, truncating: str, tmp_path: Any
) -> None:
    """The checkpoint says 400; retention removed [400, first) before the next drain: never a silent skip."""
    s = truncating
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = drain(spark, broker, out, ckpt, stream=s, maxRecordsPerTrigger="150")
    assert q.exception() is None
    assert [o for _, o, _ in _rows(spark, out)] == list(range(400))
    _publish_chunks(broker, s, b"b", 1000, 50)
    first, tail = settled_bounds(broker, s, truncated=True)
    assert first > 400
    with pytest.raises(PySparkException) as failed:  # Spark wraps the DataLossError; its text is checked
        drain(spark, broker, out, ckpt, stream=s, maxRecordsPerTrigger="150")
    text = str(failed.value)
    assert "DataLossError" in text and f"offsets [400, {first}) of stream '{s}' are lost" in text, text[
        -2000:
    ]
    assert [o for _, o, _ in _rows(spark, out)] == list(range(400))  # nothing written by the failed drain
    q = drain(spark, broker, out, ckpt, stream=s, maxRecordsPerTrigger="150", failOnDataLoss="false")
    assert q.exception() is None
    assert [o for _, o, _ in _rows(spark, out)] == list(range(400)) + list(range(first, tail))


def test_a_partition_added_under_a_checkpoint_is_read_from_offset_0_and_retention_before_is_data_loss(
    spark: Any, broker: BrokerSettings, streams: StreamFactory, tmp_path: Any
) -> None:
    """A partition bound to the super stream after the checkpoint read it, then truncated by
    retention before the next batch: the query reads it from offset 0, as Spark's Kafka source reads
    an added partition ("starts from X instead of 0" is data loss), so what retention took is
    reported (before the fix: read from its first offset kept, no error; found by the campaign,
    seed 3060870752: 76 messages of the drain consumer's new partition in no output)."""
    name, parts = streams.super_stream(2)
    publish(broker, parts[0], [b"a"] * 10)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    drain(spark, broker, out, ckpt, superstream=name)
    added = streams.add_partition(name, 2, arguments=dict(RETENTION))
    _publish_chunks(broker, added, b"n", 1000, 50)
    first, tail = settled_bounds(broker, added, truncated=True)
    assert first > 0
    with pytest.raises(PySparkException) as failed:
        drain(spark, broker, out, ckpt, superstream=name)
    assert f"offsets [0, {first}) of stream '{added}' are lost" in str(failed.value), str(failed.value)[
        -2000:
    ]
    drain(spark, broker, out, ckpt, superstream=name, failOnDataLoss="false")
    got = sorted(o for s, o, _ in _rows(spark, out) if s == added)
    assert got == list(range(first, tail))
