"""The DAG under `dag.test()` against the test broker: the new messages land in Parquet once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pytest_rmqs import RabbitMQTestBroker

pytest.importorskip("airflow")
DAG_FILE = Path(__file__).parent / "dags" / "orders_to_parquet.py"


def load_dag(monkeypatch: pytest.MonkeyPatch, **env: str):  # type: ignore[no-untyped-def]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location("orders_to_parquet", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def test_the_dag_writes_new_messages_to_parquet(
    airflow_db: None,
    rmqs_broker: RabbitMQTestBroker,
    rmqs_stream: str,
    rmqs_airflow_conn_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rmqs_broker.publish([f"order-{i}" for i in range(100)], stream=rmqs_stream)
    dag = load_dag(monkeypatch, ORDERS_STREAM=rmqs_stream, ORDERS_OUTPUT=str(tmp_path / "out"))

    assert dag.test().state == "success"

    table = pq.read_table(tmp_path / "out")
    assert sorted(table.column("value").to_pylist()) == sorted(f"order-{i}".encode() for i in range(100))
    watermark = rmqs_broker.handle().stored_offsets("orders-to-parquet", stream=rmqs_stream)
    assert watermark[rmqs_stream] is not None and watermark[rmqs_stream] >= 99
