"""Issue 42's silent losses, through the public Airflow operators against the real broker.

Each case lost or duplicated data with no error (lag 0, `watermark_stored: true`) before its fix;
each test counts every offset (and every body) the outputs hold. Cases 3 (an open time interval)
and 4 (a produce retry after a partition was added) are in tests/airflow/test_time_intervals.py and
tests/integration/test_produce_partitions_changed.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_rmqs.operators import RabbitMQStreamConsumeOperator
from pyspark_rmqs.errors import LeaseLostError
from pyspark_rmqs.runs import consume as consume_run
from pyspark_rmqs.runs import record as run_record
from pyspark_rmqs.watermarks import watermarks
from tests.airflow.test_run_record import Crash, parquet_offsets
from tests.e2e.faults.test_lease_loss import close_lease_connection
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish

pytestmark = [pytest.mark.broker, pytest.mark.airflow]


def _bodies(got: list[pa.RecordBatch]) -> list[bytes]:
    return [v for b in got for v in b["value"].to_pylist()]


# --------------------------------------------------- 1: a stream re-created, then a run while empty


def test_a_stream_recreated_and_planned_while_empty_delivers_every_new_message(
    broker: BrokerSettings, streams: Any
) -> None:
    """5,000 read; the stream is deleted and created again; the next scheduled run fires while it
    is still empty; 10,000 arrive. Before: the empty run stored the old watermark (4,999) on the new
    stream and the next run read from 5,000 on: 4,999 of 10,000 never delivered, lag 0."""
    s = streams.stream("recreated")
    got: list[pa.RecordBatch] = []

    def run() -> dict[str, Any]:
        op = RabbitMQStreamConsumeOperator(
            task_id="c", stream=s, consumer_name="etl", apply_function=got.append
        )
        return op.execute({})

    publish(broker, s, [b"old%05d" % i for i in range(5000)])
    assert run()["rows"] == 5000
    c = client(broker)
    c.delete_stream(s)
    c.create_stream(s, {})
    empty = run()
    assert empty["rows"] == 0 and empty["lag_after"] == 0
    assert watermarks(conn_of(broker), "etl", stream=s).partitions[0].stored is None  # nothing stored
    new = [b"new%05d" % i for i in range(10000)]
    publish(broker, s, new)
    last = run()
    assert last["rows"] == 10000 and last["lag_after"] == 0
    assert _bodies(got)[5000:] == new  # every new message once, in order


# ------------------------------------------- 2: `latest`, then a partition added to the super stream


def test_a_partition_added_under_latest_is_read_from_its_start(broker: BrokerSettings, streams: Any) -> None:
    """A consumer starting at `latest` has run; partition 2 is bound and producers route to it.
    Before: the next run planned the new partition from its tail (93 of 430 never delivered)."""
    name, parts = streams.super_stream(2)
    got: list[pa.RecordBatch] = []

    def run() -> dict[str, Any]:
        op = RabbitMQStreamConsumeOperator(
            task_id="c",
            superstream=name,
            consumer_name="late",
            starting_offsets="latest",
            apply_function=got.append,
        )
        return op.execute({})

    for p in parts:
        publish(broker, p, [b"before"] * 20)  # before the consumer's first run: not expected
    assert run()["rows"] == 0
    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(100)])
    added = streams.add_partition(name, 2)
    publish(broker, added, [f"{added}:{i}".encode() for i in range(130)])
    summary = run()
    assert summary["rows"] == 330 and summary["lag_after"] == 0
    want = sorted(f"{p}:{i}".encode() for p in parts for i in range(100))
    want += sorted(f"{added}:{i}".encode() for i in range(130))
    assert sorted(_bodies(got)) == sorted(want)
    assert Counter(_bodies(got)).most_common(1)[0][1] == 1
    # The consumer stored its place on the new partition too: the next run reads nothing again.
    assert run()["rows"] == 0


# ----------------------------- 5: a storing run at an explicit start, killed after its output commit


def test_a_storing_run_at_an_explicit_start_killed_after_its_iceberg_commit_resumes_on_retry(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`store_watermark=True` with `start={...}` into Iceberg, killed right after the Iceberg commit,
    retried after 200 more messages. Before: the retry planned a new range (it resumed only runs
    starting at the watermark) and the table held 1,200 rows for 700 offsets."""
    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog import load_catalog

    s = streams.stream("explicit")
    publish(broker, s, [b"m%04d" % i for i in range(1000)])
    catalog = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"file://{tmp_path}/warehouse",
    }

    def run() -> dict[str, Any]:
        op = RabbitMQStreamConsumeOperator(
            task_id="c",
            stream=s,
            consumer_name="exp",
            start={s: 300},
            store_watermark=True,
            output_path="lake.events",
            output_format="iceberg",
            iceberg_catalog=catalog,
        )
        return op.execute({})

    real_advance = run_record.advance

    def killed(*a: Any, **k: Any) -> Any:
        raise Crash("killed right after the Iceberg commit")

    monkeypatch.setattr(run_record, "advance", killed)
    with pytest.raises(Crash):
        run()
    monkeypatch.setattr(run_record, "advance", real_advance)
    publish(broker, s, [b"n%04d" % i for i in range(200)])
    retry = run()
    assert retry["resumed_plan"] and retry["end_offsets"] == {s: 1000}
    table = load_catalog("rmqs", **catalog).load_table("lake.events").scan(selected_fields=("offset",))
    offsets = table.to_arrow().column("offset").to_pylist()
    assert sorted(offsets) == list(range(300, 1000))  # 700 rows for 700 offsets
    assert watermarks(conn_of(broker), "exp", stream=s).partitions[0].stored == 999


# ------------------------------------------------------------- 6: the lease lost while the sink runs


@pytest.mark.parametrize("output", ["function", "parquet"])
def test_a_run_whose_lease_ends_mid_sink_stops_and_the_next_run_delivers_once(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """Run A's lease ends in its sink (the broker closes the lease's connection); run B takes the
    name, resumes A's plan and delivers it. Before: A went on delivering every batch (both runs
    delivered all 30,000 offsets) and failed only at its end; exactly-once outputs of the two shared
    one staging folder. Now A stops at its next batch with `LeaseLostError` (nothing committed), B's
    output holds each offset once, and the watermark is B's."""
    s = streams.stream("midsink")
    n = 30_000  # four batches of at most 8,192 rows
    for i in range(0, n, 5000):
        publish(broker, s, [b"m%05d" % j for j in range(i, i + 5000)])
    conn = conn_of(broker)
    out = tmp_path / "out"
    delivered: dict[str, list[int]] = {"A": [], "B": []}
    first_batch: list[int] = []

    def operator(who: str) -> RabbitMQStreamConsumeOperator:
        if output == "parquet":
            return RabbitMQStreamConsumeOperator(
                task_id=who, stream=s, consumer_name="mid", output_path=str(out)
            )
        return RabbitMQStreamConsumeOperator(
            task_id=who, stream=s, consumer_name="mid", apply_function=lambda b: sink(who, b)
        )

    def sink(who: str, batch: pa.RecordBatch) -> None:
        delivered[who].extend(batch["offset"].to_pylist())
        if who == "A" and not first_batch:  # A's first batch is in its sink: its lease ends now
            first_batch.append(batch.num_rows)
            close_lease_connection(broker, run_record.run_key("mid", s))
            other = operator("B").execute({})  # B takes the name and resumes A's plan
            assert other["resumed_plan"] and other["rows"] == n

    if output == "parquet":  # the sink is rmqs's Parquet writer: A's batches are watched there
        real_write = consume_run.ParquetSink.write

        def write(self: Any, batch: pa.RecordBatch) -> None:
            who = "A" if not first_batch else "B" if len(delivered["B"]) < n else "A"
            real_write(self, batch)
            sink(who, batch)

        monkeypatch.setattr(consume_run.ParquetSink, "write", write)
    with pytest.raises(LeaseLostError) as lost:
        operator("A").execute({})
    # A delivered only the batch in its sink when its lease ended; B delivered everything once.
    assert delivered["A"] == list(range(first_batch[0]))
    assert sorted(delivered["B"]) == list(range(n)) and len(delivered["B"]) == n
    if output == "parquet":
        held = Counter(o for _, o in parquet_offsets(out))
        assert sorted(held) == list(range(n)) and max(held.values()) == 1
    assert (
        "consumer 'mid'" in str(lost.value) and getattr(lost.value, "commit_state", None) == "before_commit"
    )
    assert watermarks(conn, "mid", stream=s).partitions[0].stored == n - 1
    record = run_record.latest(conn, "mid", s)
    assert record is not None and record.done and record.attempt == 1


# ------------------- an unfinished run planned anew: its new partition's range was never delivered


def test_an_unfinished_run_planned_anew_reads_the_ranges_its_sink_never_delivered(
    broker: BrokerSettings, streams: Any
) -> None:
    """A run planned a partition bound since the consumer's last run ([0, 8) of partition 2, which
    stores nothing yet) and its sink failed; then another client of the consumer name stored an
    offset on partition 0, so the retry plans anew. Before: the new plan placed partition 2 at the
    failed record's end (8), as if the range had been delivered: 8 messages never delivered, lag 0,
    no `data_loss`. Found by the campaign (seed 2622322657) where retention, not a client, took the
    stored offset away (the report then named too little)."""
    name, parts = streams.super_stream(2)
    got: list[bytes] = []
    failing = [True]

    def sink(batch: pa.RecordBatch) -> None:
        if failing[0]:
            raise RuntimeError("the sink is down")
        got.extend(batch["value"].to_pylist())

    def run() -> dict[str, Any]:
        op = RabbitMQStreamConsumeOperator(
            task_id="c", superstream=name, consumer_name="etl", apply_function=sink
        )
        return op.execute({})

    for p in parts:
        publish(broker, p, [f"{p}:{i}".encode() for i in range(10)])
    failing[0] = False
    assert run()["rows"] == 20
    added = streams.add_partition(name, 2)
    new = [f"{added}:{i}".encode() for i in range(8)] + [f"{parts[0]}:{i}".encode() for i in range(10, 15)]
    publish(broker, added, new[:8])
    publish(broker, parts[0], new[8:])
    failing[0] = True
    with pytest.raises(RuntimeError, match="the sink is down"):
        run()
    c = client(broker)
    moved = c.stored_offset("etl", parts[0])
    assert moved is not None
    c.store_offsets("etl", {parts[0]: moved + 1})  # another client of the name moves it on
    failing[0] = False
    summary = run()
    assert summary["lag_after"] == 0 and "data_loss" not in summary
    assert sorted(b for b in got[20:] if b.startswith(added.encode())) == sorted(new[:8])  # partition 2 whole
    assert set(got[20:]) - set(new[:8]) <= set(new[8:])  # partition 0: after where the other client put it
    assert Counter(got).most_common(1)[0][1] == 1
