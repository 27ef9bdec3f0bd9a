"""Publishing from a Dagster asset with a producer name (issue 26): a retried step adds nothing twice."""

import time
from typing import Any

import pytest
from dagster import AssetExecutionContext, RetryPolicy, asset, materialize

from dagster_rmqs import RabbitMQStreamsResource, produce_run_identity
from pyspark_rmqs.broker.reader import read_range
from tests.support.broker import BrokerSettings
from tests.support.data import client, conn_of

pytestmark = [pytest.mark.dagster]


def test_a_retried_asset_step_publishes_each_row_once(
    broker: BrokerSettings, streams: Any, rabbitmq: RabbitMQStreamsResource
) -> None:
    """The first attempt sends 2,500 of 3,000 rows (the broker stores 2,000) and fails; Dagster's
    RetryPolicy runs the step again in the same run: the stream holds each row once."""
    s = streams.stream("dp")
    identities: list[str] = []

    def rows(attempt: int) -> Any:
        for i in range(3000):
            if attempt == 0 and i == 2500:
                deadline = time.monotonic() + 30
                while client(broker).tail(s) < 2000 and time.monotonic() < deadline:
                    time.sleep(0.05)
                raise RuntimeError("injected failure after 2,500 of 3,000 rows")
            yield f"row-{i:05d}".encode()

    @asset(retry_policy=RetryPolicy(max_retries=1))
    def loaded(context: AssetExecutionContext, rabbitmq: RabbitMQStreamsResource) -> None:
        identities.append(produce_run_identity(context))
        rabbitmq.publish(
            rows(context.retry_number),
            stream=s,
            producer_name="loader",
            run_identity=produce_run_identity(context),
        )

    result = materialize([loaded], resources={"rabbitmq": rabbitmq}, raise_on_error=False)
    assert result.success
    assert len(identities) == 2 and identities[0] == identities[1] == f"loaded/{result.run_id}"
    got = read_range(conn_of(broker), s, 0, client(broker).tail(s)).column("value").to_pylist()
    assert len(got) == 3000 and sorted(got) == [f"row-{i:05d}".encode() for i in range(3000)], (
        f"{len(got)} messages for 3,000 rows ({len(got) - len(set(got))} duplicates)"
    )
