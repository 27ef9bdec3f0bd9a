"""A Dagster asset materialized against the test broker (the Arrow engine: no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_rmqs import RabbitMQTestBroker

dagster = pytest.importorskip("dagster")


def test_the_asset_materializes_the_stream(
    rmqs_broker: RabbitMQTestBroker, rmqs_stream: str, rmqs_dagster_resource, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from dagster_rmqs import build_stream_asset

    rmqs_broker.publish([f"event-{i}" for i in range(40)], stream=rmqs_stream)
    orders = build_stream_asset(
        "orders", stream=rmqs_stream, consumer_name="orders-asset", output_path=str(tmp_path), engine="arrow"
    )

    result = dagster.materialize([orders], resources={"rabbitmq": rmqs_dagster_resource})

    assert result.success
    (materialization,) = result.asset_materializations_for_node("orders")
    assert materialization.metadata["dagster/row_count"].value == 40
    assert rmqs_dagster_resource.lag("orders-asset", stream=rmqs_stream) == 0
