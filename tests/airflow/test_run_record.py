"""The run record at the watermark protocol's edges (issue 26), through the public operators.

Every test runs against the real broker and counts offsets: what the output holds per (stream,
offset), and where the watermark is. Each case failed on the protocol before the run record
(partition-wise plans, a token without stream identity, no lease).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from airflow_rmqs.operators import RabbitMQStreamConsumeOperator, RabbitMQStreamReadOperator
from pyspark_rmqs.core.errors import ConsumerBusyError
from pyspark_rmqs.runs import steps
from pyspark_rmqs.runs.watermarks import store_watermarks, watermarks
from tests.support import broker as tb
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.broker, pytest.mark.airflow]


class Crash(BaseException):
    """The process dying at a chosen point (a BaseException: nothing on the way catches it)."""


def parquet_offsets(path: Path) -> list[tuple[str, int]]:
    """Every (stream, offset) in a Parquet output folder, repeats kept (rmqs's `_` folders skipped)."""
    t = pads.dataset(str(path), format="parquet", partitioning="hive", exclude_invalid_files=True).to_table(
        columns=["stream", "offset"]
    )
    return sorted(zip(t.column("stream").to_pylist(), t.column("offset").to_pylist(), strict=True))


def crash_after_the_first_partition_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run stores its first partition's watermark, then its process dies."""

    def store_one_then_die(conn: Any, consumer: str, wanted: dict[str, int], seen: Any, **kw: Any) -> None:
        first = sorted(wanted)[0]
        store_watermarks(conn, consumer, {first: wanted[first]})
        raise Crash(f"process killed after storing {first}")

    monkeypatch.setattr(steps, "store_watermarks_checked", store_one_then_die)


# --------------------------------------------------------------------------------- 1: latest


def test_a_consumer_starting_at_latest_reads_everything_after_its_first_run(
    broker: BrokerSettings, streams: Any
) -> None:
    s = streams.stream("latest")
    got: list[pa.RecordBatch] = []

    def run() -> dict[str, Any]:
        op = RabbitMQStreamConsumeOperator(
            task_id="c", stream=s, consumer_name="late", starting_offsets="latest", apply_function=got.append
        )
        return op.execute({})

    publish(broker, s, [b"old"] * 100)
    reads = [run()["rows"]]
    publish(broker, s, [b"a"] * 200)
    reads.append(run()["rows"])
    publish(broker, s, [b"b"] * 300)
    last = run()
    reads.append(last["rows"])
    assert reads == [0, 200, 300] and last["lag_after"] == 0
    bodies = [v for b in got for v in b["value"].to_pylist()]
    assert bodies == [b"a"] * 200 + [b"b"] * 300


def test_a_consumer_starting_at_latest_on_an_empty_stream_reads_the_first_messages(
    broker: BrokerSettings, streams: Any
) -> None:
    s = streams.stream("latest0")
    got: list[pa.RecordBatch] = []
    op = RabbitMQStreamConsumeOperator(
        task_id="c", stream=s, consumer_name="late0", starting_offsets="latest", apply_function=got.append
    )
    assert op.execute({})["rows"] == 0
    publish(broker, s, [b"first"] * 50)
    assert op.execute({})["rows"] == 50
    # Every one of the 50, nothing before (counted from the tail: runs add offset-tracking entries).
    tail = client(broker).tail(s)
    assert sorted(o for b in got for o in b["offset"].to_pylist()) == list(range(tail - 50, tail))
    assert [v for b in got for v in b["value"].to_pylist()] == [b"first"] * 50


# ------------------------------------------------------------------------ 2: explicit ranges


def test_an_explicit_range_run_is_a_backfill_and_never_moves_the_watermark_back(
    broker: BrokerSettings, streams: Any, tmp_path: Path
) -> None:
    s = streams.stream("explicit")
    publish(broker, s, [f"m{i}".encode() for i in range(3000)])
    out = tmp_path / "out"
    live = RabbitMQStreamConsumeOperator(task_id="live", stream=s, consumer_name="ex", output_path=str(out))
    first = live.execute({})
    assert first["rows"] == 3000 and first["mode"] == "watermark"
    stored = watermarks(conn_of(broker), "ex", stream=s).partitions[0].stored
    assert stored == 2999
    backfill = RabbitMQStreamConsumeOperator(
        task_id="bf",
        stream=s,
        consumer_name="ex",
        start={s: 0},
        end={s: 1000},
        output_path=str(tmp_path / "backfill"),
    )
    summary = backfill.execute({})
    assert watermarks(conn_of(broker), "ex", stream=s).partitions[0].stored == 2999
    assert summary["mode"] == "backfill" and summary["rows"] == 1000 and not summary["watermark_stored"]
    # Asked to store, it still never moves the watermark back, and says where it left it.
    asked = RabbitMQStreamConsumeOperator(
        task_id="bf2",
        stream=s,
        consumer_name="ex",
        start={s: 0},
        end={s: 1000},
        store_watermark=True,
        output_path=str(tmp_path / "backfill2"),
    ).execute({})
    assert asked["watermark_kept"] == {s: 2999} and not asked["watermark_stored"]
    again = live.execute({})
    assert again["rows"] == 0
    assert parquet_offsets(out) == [(s, o) for o in range(3000)]  # every offset once, no re-read


# -------------------------------------------------- 3: a crash between per-partition stores


@pytest.mark.spark
def test_a_spark_read_killed_between_partition_stores_writes_every_offset_once(
    spark: Any, broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, parts = streams.super_stream(2, prefix="split")
    for p in parts:
        publish(broker, p, [f"{p}-{i}".encode() for i in range(300)])
    out = tmp_path / "out"

    def op() -> RabbitMQStreamReadOperator:
        return RabbitMQStreamReadOperator(
            task_id="read", superstream=name, consumer_name="split", output_path=str(out)
        )

    with monkeypatch.context() as m:
        crash_after_the_first_partition_store(m)
        with pytest.raises(Crash):
            op().execute({})
    retry = op().execute({})
    assert parquet_offsets(out) == sorted((p, o) for p in parts for o in range(300))
    assert retry["resumed_plan"] and retry["sink_skipped"]
    stored = watermarks(conn_of(broker), "split", superstream=name).stored_offsets()
    assert stored == dict.fromkeys(parts, 299)
    publish(broker, parts[1], [b"new"] * 10)
    assert op().execute({})["rows"] == 10


@pytest.mark.parametrize("output", ["parquet", "iceberg"])
def test_a_consume_run_killed_between_partition_stores_writes_every_offset_once(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    name, parts = streams.super_stream(2, prefix="csplit")
    for p in parts:
        publish(broker, p, [f"{p}-{i}".encode() for i in range(300)])
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }
    path = "lake.events" if output == "iceberg" else str(tmp_path / "out")

    def run() -> dict[str, Any]:
        return RabbitMQStreamConsumeOperator(
            task_id="c",
            superstream=name,
            consumer_name="csplit",
            output_path=path,
            output_format=output,
            iceberg_catalog=catalog,
        ).execute({})

    with monkeypatch.context() as m:
        crash_after_the_first_partition_store(m)
        with pytest.raises(Crash):
            run()
    retry = run()
    if output == "iceberg":
        from pyiceberg.catalog import load_catalog

        t = (
            load_catalog("rmqs", **catalog)
            .load_table(path)
            .scan(selected_fields=("stream", "offset"))
            .to_arrow()
        )
        got = sorted(zip(t.column("stream").to_pylist(), t.column("offset").to_pylist(), strict=True))
    else:
        got = parquet_offsets(Path(path))
    assert got == sorted((p, o) for p in parts for o in range(300))
    assert retry["resumed_plan"] and retry["sink_skipped"]
    assert watermarks(conn_of(broker), "csplit", superstream=name).stored_offsets() == dict.fromkeys(
        parts, 299
    )


# ------------------------------------------------------------------ 4: a re-created stream


def test_a_deleted_and_recreated_stream_is_read_again_not_skipped(
    broker: BrokerSettings, streams: Any, tmp_path: Path
) -> None:
    s = streams.stream("again")
    out = tmp_path / "out"
    op = RabbitMQStreamConsumeOperator(task_id="c", stream=s, consumer_name="again", output_path=str(out))
    publish(broker, s, [f"old-{i}".encode() for i in range(500)])
    assert op.execute({})["rows"] == 500
    tb.run(tb.delete_stream(broker, s))
    tb.run(tb.create_stream(broker, s))
    publish(broker, s, [f"new-{i}".encode() for i in range(500)])
    first = op.execute({})
    assert first["rows"] == 500 and not first.get("sink_skipped")
    second = op.execute({})
    assert second["rows"] == 0
    bodies = sorted(
        pads.dataset(str(out), format="parquet").to_table(columns=["value"]).column("value").to_pylist()
    )
    assert bodies == sorted(
        [f"old-{i}".encode() for i in range(500)] + [f"new-{i}".encode() for i in range(500)]
    )


# ------------------------------------------------------------ 11: two runs on one consumer


def test_a_second_run_on_the_same_consumer_fails_before_it_reads(
    broker: BrokerSettings, streams: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = streams.stream("twice")
    publish(broker, s, [f"m{i}".encode() for i in range(600)])
    inside, finish = threading.Event(), threading.Event()
    first_rows: list[int] = []
    second_rows: list[int] = []

    def slow(batch: pa.RecordBatch) -> None:
        first_rows.extend(batch["offset"].to_pylist())
        inside.set()
        assert finish.wait(60)

    result: dict[str, Any] = {}

    def first() -> None:
        op = RabbitMQStreamConsumeOperator(
            task_id="one", stream=s, consumer_name="twice", apply_function=slow
        )
        result.update(op.execute({"ti": None}))

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(60)
    second = RabbitMQStreamConsumeOperator(
        task_id="two",
        stream=s,
        consumer_name="twice",
        apply_function=lambda b: second_rows.extend(b["offset"].to_pylist()),
    )
    monkeypatch.setattr(steps, "DEFAULT_LEASE_WAIT_S", 1.0)  # fail after 1 s instead of 10
    with pytest.raises(ConsumerBusyError) as busy:
        second.execute({})
    assert "consumer 'twice'" in str(busy.value) and "waited 1 s" in str(busy.value)
    assert second_rows == []  # it read nothing
    finish.set()
    t.join(60)
    assert result["rows"] == 600 and sorted(first_rows) == list(range(600))
    assert second.execute({})["rows"] == 0  # the first run stored: nothing left


# -------------------------------------------------------------- 10: two tries of an Iceberg run


def test_two_tries_of_an_iceberg_run_at_once_append_once(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A try still running (a zombie) and its retry: the retry fails before it reads; one append."""
    from pyiceberg.catalog import load_catalog

    from pyspark_rmqs.runs.outputs.iceberg import TOKEN_PROPERTY, IcebergSink

    s = streams.stream("ice2")
    publish(broker, s, [f"m{i}".encode() for i in range(5100)])
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/w"}
    inside, finish = threading.Event(), threading.Event()
    real_write = IcebergSink.write

    def held_write(self: IcebergSink, batch: pa.RecordBatch) -> None:
        if threading.current_thread().name == "first-try":
            inside.set()
            assert finish.wait(60)
        real_write(self, batch)

    monkeypatch.setattr(IcebergSink, "write", held_write)
    monkeypatch.setattr(steps, "DEFAULT_LEASE_WAIT_S", 1.0)

    def op() -> RabbitMQStreamConsumeOperator:
        return RabbitMQStreamConsumeOperator(
            task_id="ice",
            stream=s,
            consumer_name="ice2",
            output_path="lake.t",
            output_format="iceberg",
            iceberg_catalog=catalog,
        )

    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(op().execute({})), name="first-try")
    t.start()
    assert inside.wait(60)
    with pytest.raises(ConsumerBusyError):
        op().execute({})
    finish.set()
    t.join(60)
    table = load_catalog("rmqs", **catalog).load_table("lake.t")
    offsets = sorted(table.scan(selected_fields=("offset",)).to_arrow().column("offset").to_pylist())
    assert offsets == list(range(5100))
    tokens = [snap.summary.additional_properties.get(TOKEN_PROPERTY) for snap in table.metadata.snapshots]
    assert tokens == [result["token"]] * len(tokens) and result["rows"] == 5100


# ------------------------------------- 3b: a watermark put back by another client, per range


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark", "arrow"])
def test_a_watermark_put_back_by_another_client_writes_nothing_twice(
    spark: Any, broker: BrokerSettings, streams: Any, tmp_path: Path, engine: str
) -> None:
    """Commits are recognised per partition range: a range the output already holds is not written
    again when an independent client puts one partition's stored offset back."""
    name, parts = streams.super_stream(2, prefix=f"back{engine}")
    for p in parts:
        publish(broker, p, [f"{p}-{i}".encode() for i in range(300)])
    out = tmp_path / "out"

    def run() -> dict[str, Any]:
        kind = RabbitMQStreamReadOperator if engine == "spark" else RabbitMQStreamConsumeOperator
        return kind(task_id="r", superstream=name, consumer_name="back", output_path=str(out)).execute({})

    assert run()["rows"] == 600
    client(broker).store_offsets("back", {parts[1]: 99})  # not rmqs: a raw store, backwards
    publish(broker, parts[1], [b"late"] * 20)
    again = run()
    got = parquet_offsets(out)
    assert len(got) == len(set(got)) == 620  # every offset once: none of [100, 300) twice
    assert {o for s, o in got if s == parts[1]} >= set(range(300))
    assert again["already_committed"] == {parts[1]: [[100, 300]]} and again["rows"] == 20


# ------------------------------------------------------------ nothing to read: no Spark session


def test_a_spark_read_with_nothing_new_starts_no_session(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An hourly task that finds nothing after its watermark returns at once: a local session is a
    new JVM (4-9 s, docs/performance.md), the whole cost of such a run when it was started anyway."""
    s = streams.stream("idle")
    publish(broker, s, [b"x"] * 5)
    store_watermarks(conn_of(broker), "idle", {s: 4})  # everything read by an earlier run

    def no_session(self: Any) -> Any:
        raise AssertionError("a session was started for a run with nothing to read")

    monkeypatch.setattr(RabbitMQStreamReadOperator, "spark_session", no_session)
    op = RabbitMQStreamReadOperator(
        task_id="read", stream=s, consumer_name="idle", output_path=str(tmp_path / "out")
    )
    summary = op.execute({})
    assert summary["rows"] == 0, summary
    assert watermarks(conn_of(broker), "idle", stream=s).stored_offsets() == {s: 4}
