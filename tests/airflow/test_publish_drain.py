"""Publish and drain operators, executed directly (no metadata DB) against the broker and Spark."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_rmqs.hooks import RabbitMQStreamHook
from airflow_rmqs.operators import RabbitMQStreamDrainOperator, RabbitMQStreamPublishOperator
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


def test_publish_then_drain(spark: Any, broker: BrokerSettings, streams, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(2)
    source = tmp_path / "input"
    spark.createDataFrame(
        [(f"p{i}".encode(), f"key-{i}") for i in range(50)], "value binary, routing_key string"
    ).write.parquet(str(source))
    published = RabbitMQStreamPublishOperator(
        task_id="publish",
        superstream=name,
        input_path=str(source),
        sink_options='{"producerName": "loader", "routingStrategy": "hash"}',  # as a rendered template
    ).execute({})
    assert published["rows"] == 50 and published["target"] == name
    hook = RabbitMQStreamHook()
    assert sum(hook.tails(superstream=name).values()) == 50

    drain = RabbitMQStreamDrainOperator(
        task_id="drain",
        superstream=name,
        consumer_name="drainer",
        checkpoint_location=str(tmp_path / "checkpoint"),
        output_path=str(tmp_path / "out"),
        source_options={"maxRecordsPerTrigger": "20"},
        timeout=120,
    )
    ti = SimpleNamespace(dag_id="lake", task_id="drain", try_number=2)
    summary = drain.execute({"ti": ti})
    assert summary["rows"] == 50 and summary["lag_after"] == 0 and summary["batches"] >= 2
    # The standard run metrics: the task's identity and what the file sink committed, measured.
    assert (summary["pipeline"], summary["retry_count"]) == ("lake/drain", 1)
    assert summary["records_written"] == 50 and summary["bytes_read"] == sum(len(f"p{i}") for i in range(50))
    written = sum(p.stat().st_size for p in (tmp_path / "out").glob("part-*.parquet"))
    assert summary["bytes_written"] == written > 0
    out = sorted(bytes(r.value) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert out == sorted(f"p{i}".encode() for i in range(50))

    publish(broker, parts[1], [b"late"] * 3)  # the next drain picks up only what is new
    assert drain.execute({})["rows"] == 3
