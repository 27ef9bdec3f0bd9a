"""Dagster test fixtures: the broker as a `RabbitMQStreamsResource`, resources for `materialize()`."""

from typing import Any

import pytest

from dagster_rmqs import RabbitMQStreamsResource
from tests.support.broker import BrokerSettings


def resource_of(b: BrokerSettings, **overrides: str) -> RabbitMQStreamsResource:
    fields: dict[str, Any] = {
        "endpoints": f"{b.host}:{b.port}",
        "username": b.username,
        "password": b.password,
        "vhost": b.vhost,
        **overrides,
    }
    return RabbitMQStreamsResource(**fields)


@pytest.fixture
def rabbitmq(broker: BrokerSettings) -> RabbitMQStreamsResource:
    return resource_of(broker)


@pytest.fixture
def resources(rabbitmq: RabbitMQStreamsResource, spark: object) -> dict[str, object]:
    """What the factories' assets need; `spark` is the test session itself (a user's own session)."""
    return {"rabbitmq": rabbitmq, "spark": spark}
