"""Airflow without a JVM (issue 17): consume and produce operators, hook methods, the slim import path.

Every test runs against the real broker and counts offsets exactly; none of them starts Spark.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_rmqs.hooks import RabbitMQStreamHook
from airflow_rmqs.operators import (
    RabbitMQStreamConsumeOperator,
    RabbitMQStreamProduceOperator,
    RabbitMQStreamReadOperator,
)
from pyspark_rmqs import jobs
from pyspark_rmqs.broker.reader import ReadSettings, read_range
from pyspark_rmqs.broker.writer import hash_partition
from pyspark_rmqs.core.schema import source_arrow_schema
from pyspark_rmqs.runs import consume, steps
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of, publish, publish_keyed

pytestmark = [pytest.mark.airflow]

COLLECTED: list[pa.RecordBatch] = []


def collect(batch: pa.RecordBatch, tag: str = "", seen: list[str] | None = None) -> None:
    """An apply_function reachable by dotted path: `tests.airflow.test_without_spark.collect`."""
    COLLECTED.append(batch)
    if seen is not None:
        seen.append(tag)


def offsets_of(batches: list[pa.RecordBatch]) -> list[tuple[str, int]]:
    return sorted(
        (s, o) for b in batches for s, o in zip(b["stream"].to_pylist(), b["offset"].to_pylist(), strict=True)
    )


def stored(broker: BrokerSettings, consumer: str, streams: list[str]) -> dict[str, int | None]:
    return client(broker).stored_offsets(consumer, streams)


# ------------------------------------------------------------------------------ consume


def test_consume_apply_function_reads_the_watermark_range_then_only_new_data(
    broker: BrokerSettings, streams: Any
) -> None:
    s = streams.stream("cons")
    publish(broker, s, [f"m-{i}".encode() for i in range(250)])
    got: list[pa.RecordBatch] = []
    op = RabbitMQStreamConsumeOperator(
        task_id="consume", stream=s, consumer_name="c1", apply_function=got.append, metadata_fields=""
    )
    assert op.max_active_tis_per_dag == 1
    first = op.execute({})
    assert first["rows"] == 250 and first["watermark_stored"] is True
    assert first["start_offsets"] == {s: 0} and first["end_offsets"] == {s: 250} and first["lag_after"] == 0
    assert first["bytes"] == sum(len(f"m-{i}") for i in range(250))
    assert all(isinstance(b, pa.RecordBatch) and b.schema == source_arrow_schema(()) for b in got)
    assert [v for b in got for v in b["value"].to_pylist()] == [f"m-{i}".encode() for i in range(250)]
    assert offsets_of(got) == [(s, i) for i in range(250)]
    assert stored(broker, "c1", [s]) == {s: 249}

    again = op.execute({})
    assert again["rows"] == 0 and again["watermark_stored"] is False and len(got) == len(got)

    publish(broker, s, [f"n-{i}".encode() for i in range(40)])
    tail = client(broker).tail(s)  # the plan and watermark records took offsets too
    got.clear()
    third = op.execute({})
    assert third["rows"] == 40 and third["start_offsets"] == {s: 250} and third["end_offsets"] == {s: tail}
    assert [v for b in got for v in b["value"].to_pylist()] == [f"n-{i}".encode() for i in range(40)]
    assert stored(broker, "c1", [s]) == {s: tail - 1}


def test_consume_dotted_path_with_args_and_metadata_columns(broker: BrokerSettings, streams: Any) -> None:
    s = streams.stream("consdot")
    publish(broker, s, [b"x", b"y", b"z"])
    COLLECTED.clear()
    seen: list[str] = []
    op = RabbitMQStreamConsumeOperator(
        task_id="consume",
        stream=s,
        start="earliest",
        store_watermark=False,
        apply_function="tests.airflow.test_without_spark.collect",
        apply_function_args=["first"],
        apply_function_kwargs={"seen": seen},
        metadata_fields="properties,routing_key",
    )
    out = op.execute({})
    assert out["rows"] == 3 and out["watermark_stored"] is False
    assert seen == ["first"] * len(COLLECTED)
    assert COLLECTED[0].schema == source_arrow_schema(("properties", "routing_key"))
    assert [v for b in COLLECTED for v in b["value"].to_pylist()] == [b"x", b"y", b"z"]


def test_consume_bad_apply_function_path_fails_without_retry(broker: BrokerSettings, streams: Any) -> None:
    s = streams.stream("consbad")
    publish(broker, s, [b"x"])
    op = RabbitMQStreamConsumeOperator(
        task_id="consume", stream=s, consumer_name="cb", apply_function="no_such_module.fn"
    )
    with pytest.raises(AirflowFailException, match=r"no_such_module\.fn"):
        op.execute({})
    assert stored(broker, "cb", [s]) == {s: None}


def test_consume_failing_sink_keeps_the_watermark_and_the_retry_reads_the_same_range(
    broker: BrokerSettings, streams: Any
) -> None:
    s = streams.stream("consfail")
    publish(broker, s, [f"a-{i}".encode() for i in range(100)])
    calls = {"n": 0}

    def flaky(batch: pa.RecordBatch) -> None:
        calls["n"] += 1
        raise RuntimeError("the warehouse is down")

    op = RabbitMQStreamConsumeOperator(task_id="c", stream=s, consumer_name="cf", apply_function=flaky)
    with pytest.raises(RuntimeError, match="warehouse"):
        op.execute({})
    assert stored(broker, "cf", [s]) == {s: None}
    publish(broker, s, [f"b-{i}".encode() for i in range(30)])  # arrives between the tries
    got: list[pa.RecordBatch] = []
    retry = RabbitMQStreamConsumeOperator(
        task_id="c", stream=s, consumer_name="cf", apply_function=got.append
    )
    out = retry.execute({})
    assert out["resumed_plan"] is True and out["end_offsets"] == {s: 100} and out["rows"] == 100
    assert offsets_of(got) == [(s, i) for i in range(100)]
    assert stored(broker, "cf", [s]) == {s: 99}
    assert retry.execute({})["rows"] == 30


def test_consume_parquet_superstream_one_file_per_range_and_a_retry_replaces_it(
    broker: BrokerSettings, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, parts = streams.super_stream(3)
    items = [(f"k{i}", f"o-{i}".encode()) for i in range(300)]
    publish_keyed(broker, name, items)
    expected = {p: sum(1 for k, _ in items if parts[hash_partition(k, 3)] == p) for p in parts}
    out = tmp_path / "lake"
    op = RabbitMQStreamConsumeOperator(
        task_id="c", superstream=name, consumer_name="pq", output_path=str(out), metadata_fields=""
    )
    real_store = steps.store_watermarks_checked

    def store_fails(*a: Any, **k: Any) -> None:
        raise ConnectionError("broker went away before the store")

    monkeypatch.setattr(steps, "store_watermarks_checked", store_fails)
    with pytest.raises(ConnectionError):
        op.execute({})
    first_files = sorted(p.name for p in out.iterdir() if not p.name.startswith("_"))
    token = json.loads(next((out / "_rmqs_commits").iterdir()).read_text())["token"]
    assert first_files == sorted(f"{p}-0-{expected[p]}-{token[:12]}.parquet" for p in parts)
    assert len(list((out / "_rmqs_commits").iterdir())) == 1  # committed before the store failed
    monkeypatch.setattr(steps, "store_watermarks_checked", real_store)
    publish_keyed(broker, name, [("late", b"late")])  # not in the pending plan
    summary = op.execute({})
    assert summary["resumed_plan"] is True and summary["rows"] == 300
    # The range was committed: the retry read and wrote nothing again, it only stored the watermark.
    assert summary["sink_skipped"] is True and summary["records_written"] == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("_")) == first_files  # no temp files
    assert sorted(summary["files"]) == sorted(str(out / f) for f in first_files)
    table = pq.read_table(str(out))
    assert table.num_rows == 300
    assert sorted(table.column("value").to_pylist()) == sorted(b for _, b in items)
    assert stored(broker, "pq", parts) == {p: expected[p] - 1 for p in parts}


def test_consume_memory_is_bounded_by_the_batches_not_the_range(broker: BrokerSettings, streams: Any) -> None:
    s = streams.stream("consmem")
    publish(broker, s, [b"v" * 100] * 30_000)
    sizes: list[int] = []
    plan = consume_plan(broker, s)
    settings = ReadSettings(metadata_fields=(), queue_capacity=2000, batch_rows=4096)
    summary = consume.run_consume(
        conn_of(broker), plan, lambda b: sizes.append(b.num_rows), store_watermark=False, settings=settings
    )
    assert summary.rows == 30_000 and sum(sizes) == 30_000
    # A batch is flushed once it reaches 4096 rows, so it holds at most 4095 plus the chunk that
    # crossed the line (the broker may merge the publisher's frames into chunks of a few thousand):
    # bounded by the chunk size, never by the 30,000-message range.
    assert max(sizes) < 4096 + 8192


def consume_plan(broker: BrokerSettings, stream: str) -> Any:
    return jobs.plan_read(conn_of(broker), stream=stream, start="earliest", persist=False)


# ------------------------------------------------------------------------------ produce


def messages(n: int, prefix: str = "p") -> Any:
    yield b"raw-bytes"
    yield "text"
    for i in range(n):
        yield {
            "value": f"{prefix}-{i}",
            "properties": {"message_id": f"id-{i}", "content_type": "text/plain"},
            "application_properties": {"i": str(i)},
        }


def test_produce_bytes_str_and_dicts_with_properties(broker: BrokerSettings, streams: Any) -> None:
    s = streams.stream("prod")
    op = RabbitMQStreamProduceOperator(
        task_id="produce",
        stream=s,
        producer_function=messages,
        producer_function_args=[50],
        producer_function_kwargs={"prefix": "q"},
    )
    out = op.execute({})
    assert out["messages"] == {s: 52} and out["rows"] == 52
    table = read_range(
        conn_of(broker),
        s,
        0,
        client(broker).tail(s),
        ReadSettings(metadata_fields=("properties", "application_properties")),
    )
    assert table.column("value").to_pylist() == [b"raw-bytes", b"text"] + [
        f"q-{i}".encode() for i in range(50)
    ]
    props = table.column("properties").to_pylist()
    assert props[2]["message_id"] == "id-0" and props[2]["content_type"] == "text/plain"
    assert dict(table.column("application_properties").to_pylist()[51]) == {"i": "49"}


def keyed(n: int) -> list[dict[str, Any]]:
    return [{"value": f"v{i}".encode(), "routing_key": f"key-{i}"} for i in range(n)]


def test_produce_superstream_routes_by_hash_and_counts_per_partition(
    broker: BrokerSettings, streams: Any
) -> None:
    name, parts = streams.super_stream(3)
    op = RabbitMQStreamProduceOperator(
        task_id="p",
        superstream=name,
        producer_function="tests.airflow.test_without_spark.keyed",
        producer_function_args=[120],
        producer_name="prod-test",
    )
    out = op.execute({})
    expected = {p: sum(1 for i in range(120) if parts[hash_partition(f"key-{i}", 3)] == p) for p in parts}
    assert out["messages"] == expected and out["rows"] == 120
    assert client(broker).tails(parts) == expected
    got = read_range(
        conn_of(broker), parts[0], 0, expected[parts[0]], ReadSettings(metadata_fields=("routing_key",))
    )
    assert all(parts[hash_partition(k, 3)] == parts[0] for k in got.column("routing_key").to_pylist())


def test_produce_superstream_without_routing_key_fails_without_retry(
    broker: BrokerSettings, streams: Any
) -> None:
    name, _ = streams.super_stream(2)
    op = RabbitMQStreamProduceOperator(task_id="p", superstream=name, producer_function=lambda: [b"no key"])
    with pytest.raises(AirflowFailException, match="routing_key"):
        op.execute({})


# ------------------------------------------------------------------------------ hook


def test_hook_manages_streams_publishes_and_reads_batches(broker: BrokerSettings) -> None:
    import uuid

    hook = RabbitMQStreamHook()
    s = f"hook-{uuid.uuid4().hex[:8]}"
    ss = f"hookss-{uuid.uuid4().hex[:8]}"
    try:
        hook.create_stream(s)
        hook.create_super_stream(ss, 2)
        assert client(broker).stream_exists(s) and client(broker).partitions(ss) == [f"{ss}-0", f"{ss}-1"]
        assert hook.publish([b"a", "b", {"value": b"c"}], stream=s) == {s: 3}
        counts = hook.publish([{"value": b"x", "routing_key": "k1"}], superstream=ss)
        assert sum(counts.values()) == 1 and set(counts) == {f"{ss}-0", f"{ss}-1"}
        batches = list(hook.read_batches(s, 1, 3))
        assert [v for b in batches for v in b["value"].to_pylist()] == [b"b", b"c"]
        assert hook.tails(stream=s) == {s: 3}
        hook.store_watermarks("hc", {s: 2})
        assert hook.stored_offsets("hc", stream=s) == {s: 2} and hook.lag("hc", stream=s) == 0
    finally:
        hook.delete_stream(s)
        hook.delete_super_stream(ss)
    assert not client(broker).stream_exists(s)


# ------------------------------------------------------------------------------ slim import path


def test_orchestrator_imports_load_neither_pyspark_nor_pyarrow() -> None:
    code = (
        "import sys, json\n"
        "import airflow_rmqs.hooks, airflow_rmqs.sensors, airflow_rmqs.triggers, airflow_rmqs.queues\n"
        "import airflow_rmqs.assets, airflow_rmqs.get_provider_info\n"
        "from airflow_rmqs.assets import create_asset\n"
        "create_asset(host='h', stream='s')\n"
        "heavy = ('pyspark', 'pyarrow', 'py4j')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_spark_operator_without_pyspark_fails_at_once_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a)
    )
    op = RabbitMQStreamReadOperator(task_id="r", stream="any", consumer_name="c", output_path=str(tmp_path))
    with pytest.raises(AirflowFailException, match=r"rmqs\[spark\]"):
        op.execute({})
