"""The DAG under `dag.test()` against the test broker: the new messages land in Parquet once."""

from __future__ import annotations

import runpy
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pytest_rmqs import RabbitMQTestBroker

pytest.importorskip("airflow")


def test_the_dag_writes_new_messages_to_parquet(
    airflow_db: None,
    rmqs_broker: RabbitMQTestBroker,
    rmqs_stream: str,
    rmqs_airflow_conn_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rmqs_broker.publish([f"order-{i}" for i in range(100)], stream=rmqs_stream)
    monkeypatch.setenv("ORDERS_STREAM", rmqs_stream)
    monkeypatch.setenv("ORDERS_OUTPUT", str(tmp_path / "out"))
    dag = runpy.run_path(str(Path(__file__).parent / "dags" / "orders_to_parquet.py"))["dag"]

    assert dag.test().state == "success"

    table = pq.read_table(tmp_path / "out")
    assert sorted(table.column("value").to_pylist()) == sorted(f"order-{i}".encode() for i in range(100))
    watermark = rmqs_broker.handle().stored_offsets("orders-to-parquet", stream=rmqs_stream)
    assert watermark[rmqs_stream] is not None and watermark[rmqs_stream] >= 99
