"""Structured Streaming reads: checkpoints, AvailableNow, admission control, broker-stored offsets."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from pyspark_rmqs import lag_from_progress
from pyspark_rmqs.spark.compat import ADMISSION_CONTROL
from tests.support.broker import BrokerSettings
from tests.support.data import client, publish, spark_options

pytestmark = [pytest.mark.spark, pytest.mark.broker]

# Read limits (maxRecordsPerTrigger, maxBytesPerTrigger) need PySpark 4.2's admission control; on
# 4.1 (make test-compat) they fail with the error test_read_limits_name_the_spark_they_need checks.
needs_admission_control = pytest.mark.skipif(
    not ADMISSION_CONTROL, reason="read limits need PySpark 4.2+ (admission control)"
)


def limited(max_records: str) -> dict[str, str]:
    """`maxRecordsPerTrigger` where the PySpark has admission control; none (one batch) before 4.2."""
    return {"maxRecordsPerTrigger": max_records} if ADMISSION_CONTROL else {}


def drain(spark: SparkSession, b: BrokerSettings, out: Path, ckpt: Path, **opts: str):  # type: ignore[no-untyped-def]
    """One AvailableNow run into Parquet; returns the finished query."""
    q = (
        spark.readStream.format("rabbitmq_streams")
        .options(**spark_options(b, metadataFields="", **opts))
        .load()
        .select("stream", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(180), "AvailableNow query did not finish"
    assert q.exception() is None, q.exception()
    return q


def output(spark: SparkSession, out: Path) -> list[tuple[str, int, bytes]]:
    if not out.exists():
        return []
    return sorted((r.stream, r.offset, bytes(r.value)) for r in spark.read.parquet(str(out)).collect())


def test_restart_from_checkpoint_reads_everything_exactly_once(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    s = streams.stream()
    first = [f"a{i}".encode() for i in range(300)]
    publish(broker, s, first)
    drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s)
    assert output(spark, tmp_path / "out") == [(s, i, first[i]) for i in range(300)]
    more = [f"b{i}".encode() for i in range(200)]
    publish(broker, s, more)
    drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s)
    allv = first + more
    assert output(spark, tmp_path / "out") == [(s, i, allv[i]) for i in range(500)]


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "lenient"])
def test_a_stream_created_again_below_the_checkpoints_offset_is_data_loss_not_silence(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path, fail: bool
) -> None:  # type: ignore[no-untyped-def]
    """A stream deleted and created again, shorter than the checkpoint's offset: the query used to
    read nothing and wait for the new stream to pass the old end (its first messages in no output,
    no error). Now data loss: the query fails naming it, or (failOnDataLoss=false) reads the new
    stream from its first offset."""
    from tests.support import broker as tb

    s = streams.stream()
    publish(broker, s, [f"a{i}".encode() for i in range(100)])
    drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s)
    tb.run(tb.delete_stream(broker, s))
    tb.run(tb.create_stream(broker, s))
    new = [f"n{i}".encode() for i in range(30)]
    publish(broker, s, new)
    if fail:
        with pytest.raises((AssertionError, StreamingQueryException), match="deleted and created again"):
            drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s)
        return
    drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s, failOnDataLoss="false")
    assert [v for _, _, v in output(spark, tmp_path / "out") if v.startswith(b"n")] == new


def test_available_now_stops_at_the_snapshot_while_producers_publish(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    s = streams.stream()
    publish(broker, s, [b"before"] * 1000)
    stop = threading.Event()

    def keep_publishing() -> None:
        while not stop.is_set():
            publish(broker, s, [b"during"] * 50)
            time.sleep(0.05)

    t = threading.Thread(target=keep_publishing, daemon=True)
    t.start()
    try:
        # Before PySpark 4.2, Spark's own AvailableNow wrapper fixes the end at the first latestOffset.
        drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s, **limited("400"))
        tail_at_end = client(broker).tail(s)
        time.sleep(0.5)
        assert t.is_alive(), "the producer must still be publishing when the query has stopped"
    finally:
        stop.set()
        t.join(30)
    got = [o for _, o, _ in output(spark, tmp_path / "out")]
    assert got == list(range(len(got))), "no gap, no duplicate"
    assert 1000 <= len(got) <= tail_at_end
    assert client(broker).tail(s) > len(got), "data published after the snapshot is left for the next run"


@needs_admission_control
def test_max_records_per_trigger_batch_sizes(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    s = streams.stream()
    publish(broker, s, [b"x"] * 350)
    q = drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s, maxRecordsPerTrigger="100")
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [100, 100, 100, 50]
    # The source reports its latest offset (the tail, 350): each batch's lag is what is left after it.
    lags = [lag_from_progress(p) for p in batches]
    assert [[lag["offsetsBehindLatest"] for lag in one] for one in lags] == [
        [{s: 250}],
        [{s: 150}],
        [{s: 50}],
        [{s: 0}],
    ]
    [last] = lag_from_progress(q.lastProgress)
    assert last["offsetsBehindLatest"] == {s: 0}
    assert (last["minOffsetsBehindLatest"], last["maxOffsetsBehindLatest"]) == (0, 0)


def test_resume_from_broker_stored_offset_without_checkpoint(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    s = streams.stream()
    bodies = [f"m{i}".encode() for i in range(250)]
    publish(broker, s, bodies)
    client(broker).store_offsets("etl-orders", {s: 99})
    drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s, consumerName="etl-orders")
    assert output(spark, tmp_path / "out") == [(s, i, bodies[i]) for i in range(100, 250)]
    # Spark commits a micro-batch to its sources when it plans the next one: the stored offset
    # (best-effort metadata) follows one batch behind the checkpoint.
    publish(broker, s, [b"late"] * 10)
    drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s, consumerName="etl-orders")
    # offset 250 holds the offset-tracking entry written by store_offsets: no user message there
    assert [o for _, o, _ in output(spark, tmp_path / "out")] == [*range(100, 250), *range(251, 261)]
    # The restarted query commits the first run's last batch (ending at 250) to the source before
    # planning; its own only batch ends the AvailableNow run and is never committed to the source.
    assert client(broker).stored_offset("etl-orders", s) == 249


@needs_admission_control
@pytest.mark.parametrize(("tracking", "stored"), [("false", None), (None, 39)])
def test_server_side_offset_tracking_false_stores_nothing(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    tracking: str | None,
    stored: int | None,
) -> None:
    """Five micro-batches of 10, so Spark commits batches to the source (it commits a batch when it
    plans the next one): with tracking off nothing is stored; the control, tracking on by default
    with a consumerName, stores the last committed offset, so the test can tell the two apart."""
    s = streams.stream()
    publish(broker, s, [b"x"] * 50)
    name = f"tracking-{tracking}"
    opts = {"consumerName": name, "maxRecordsPerTrigger": "10", "minPartitions": "2"}
    if tracking is not None:
        opts["serverSideOffsetTracking"] = tracking
    q = drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s, **opts)
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [10] * 5
    assert len(output(spark, tmp_path / "out")) == 50
    time.sleep(1.0)  # stores run in the background (bounded wait): give a late one time to land
    # Spark commits batch N to the source when it plans batch N+1; the last batch of an AvailableNow
    # run is never committed to the source, so tracking stores 39 (the batch ending at 40).
    assert client(broker).stored_offset(name, s) == stored


def test_super_stream_streaming_read(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    name, parts = streams.super_stream(2)
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(120)])
    drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", superstream=name, **limited("100"))
    got = output(spark, tmp_path / "out")
    for p in parts:
        assert [(o, v) for s, o, v in got if s == p] == [(i, f"{p}:{i}".encode()) for i in range(120)]


def test_deleted_partition_is_data_loss(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    name, parts = streams.super_stream(3)
    for p in parts:
        publish(broker, p, [p.encode()] * 20)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    drain(spark, broker, out, ckpt, superstream=name)
    assert len(output(spark, out)) == 60
    client(broker).delete_stream(parts[1])
    publish(broker, parts[0], [b"more"] * 5)
    q = (
        spark.readStream.format("rabbitmq_streams")
        .options(**spark_options(broker, superstream=name, metadataFields=""))
        .load()
        .select("stream", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException) as failed:
        q.awaitTermination(180)
    # Spark wraps the source's error; what it wraps must be rmqs's DataLossError about that partition.
    assert re.search(
        rf"pyspark_rmqs\.errors\.DataLossError: partition stream '{re.escape(parts[1])}'.* no longer exists",
        str(failed.value),
    ), str(failed.value)[:3000]
    drain(spark, broker, out, ckpt, superstream=name, failOnDataLoss="false")
    got = output(spark, out)
    assert len(got) == 65 and sum(1 for s, _, v in got if v == b"more") == 5


@needs_admission_control
def test_a_micro_batch_whose_sink_fails_is_not_committed_and_is_replayed_whole(
    spark: SparkSession, broker: BrokerSettings, streams, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A `foreachBatch` sink failing on batch 1 (of three batches of 200): the query fails, batch 1 is
    in neither Spark's commit log nor the broker's stored offset for `consumerName` (which stays at
    batch 0's end, 199), and the query restarted on its checkpoint replays batch 1 with exactly the
    offsets the failed attempt had, then batch 2: every offset committed once (the failed attempt's
    rows reached the sink once more, as any at-least-once sink may see a replayed batch)."""
    s = streams.stream("sf")
    publish(broker, s, [f"f{i:04d}".encode() for i in range(600)])
    seen: list[tuple[int, list[int]]] = []
    ckpt = tmp_path / "ckpt"

    def sink(fail_on: int | None):  # type: ignore[no-untyped-def]
        def fn(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
            seen.append((batch_id, sorted(int(r.offset) for r in df.select("offset").collect())))
            if batch_id == fail_on:
                raise RuntimeError("the sink failed")

        return fn

    def start(fail_on: int | None):  # type: ignore[no-untyped-def]
        return (
            spark.readStream.format("rabbitmq_streams")
            .options(
                **spark_options(
                    broker, stream=s, metadataFields="", maxRecordsPerTrigger="200", consumerName="sinkfail"
                )
            )
            .load()
            .writeStream.foreachBatch(sink(fail_on))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )

    q = start(fail_on=1)
    with pytest.raises(StreamingQueryException, match="the sink failed"):
        q.awaitTermination(180)
    assert [b for b, _ in seen] == [0, 1]
    assert sorted(p.name for p in (ckpt / "commits").iterdir() if p.name.isdigit()) == ["0"]
    stored = client(broker).stored_offset("sinkfail", s)
    assert stored is None or stored <= 199, f"the failed batch moved the stored offset to {stored}"
    failed = seen[1][1]
    assert failed == list(range(200, 400))
    q = start(fail_on=None)
    assert q.awaitTermination(180) and q.exception() is None
    assert [b for b, _ in seen] == [0, 1, 1, 2]
    assert seen[2][1] == failed, "the replayed batch read other offsets than the failed one"
    committed = seen[0][1] + seen[2][1] + seen[3][1]
    assert committed == list(range(600))


@pytest.mark.skipif(ADMISSION_CONTROL, reason="PySpark 4.2+ has admission control: tested above")
@pytest.mark.parametrize("option", ["maxRecordsPerTrigger", "maxBytesPerTrigger"])
def test_read_limits_name_the_spark_they_need(
    spark: SparkSession,
    broker: BrokerSettings,
    streams,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    option: str,
) -> None:
    """Before PySpark 4.2 a read limit cannot be honoured: the query fails naming the option and the
    Spark it needs, instead of silently reading everything in one batch; nothing is written."""
    import pyspark

    s = streams.stream()
    publish(broker, s, [b"x"] * 10)
    with pytest.raises(Exception) as failed:
        drain(spark, broker, tmp_path / "out", tmp_path / "ckpt", stream=s, **{option: "5"})
    message = str(failed.value)
    assert f"{option} needs Spark 4.2 or later" in message
    assert f"this is PySpark {pyspark.__version__}" in message
    assert not list((tmp_path / "out").glob("*.parquet")), "nothing is written"
