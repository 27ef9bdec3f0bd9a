"""A scheduled publish with `producerName`: every run's rows are kept (issue 14: later runs were dropped)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_rmqs.operators import RabbitMQStreamPublishOperator
from pyspark_rmqs.broker.reader import read_range
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


def _rows_of_the_run(spark: Any, context: dict[str, Any]) -> Any:
    """Each run publishes its own 300 rows, named after its run id."""
    run = context["run_id"]
    return spark.range(0, 300, 1, 2).selectExpr(f"format_string('{run}-%04d', id) as value")


def test_two_runs_with_one_producer_name_keep_both_runs_rows(
    spark: Any, broker: BrokerSettings, streams
) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream("ap")
    op = RabbitMQStreamPublishOperator(
        task_id="publish",
        stream=s,
        dataframe_callable=_rows_of_the_run,
        sink_options={"producerName": "hourly"},
    )
    for run in ("scheduled__2026-01-01T00", "scheduled__2026-01-01T01"):
        assert op.execute({"run_id": run})["rows"] == 300
    got = read_range(conn_of(broker), s, 0, client(broker).tail(s)).column("value").to_pylist()
    expected = [
        f"{run}-{i:04d}".encode()
        for run in ("scheduled__2026-01-01T00", "scheduled__2026-01-01T01")
        for i in range(300)
    ]
    assert len(got) == 600, f"{len(got)} of 600 rows: a run's rows were dropped"
    assert sorted(got) == sorted(expected)
