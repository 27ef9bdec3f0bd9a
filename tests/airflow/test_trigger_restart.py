"""A deferred new-data sensor's trigger outlives a broker restart.

The broker this test restarts is the second local one (`restartable_broker`): `broker` below is it,
so `streams` makes the stream there and the trigger's connection points at it, and the tests other
workers run meanwhile never see it go down. (It was in test_triggers.py, run alone after every other
test.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_rmqs.triggers import RabbitMQStreamNewDataTrigger
from tests.airflow.test_triggers import first_event
from tests.e2e.faults.support import broker_down, broker_up
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = [pytest.mark.airflow, pytest.mark.broker]

CONN_ID = "rabbitmq_stream_restartable"


@pytest.fixture
def broker(restartable_broker: BrokerSettings) -> BrokerSettings:
    return restartable_broker


@pytest.mark.slow
def test_new_data_trigger_rides_out_a_broker_restart(broker: BrokerSettings, streams, conn_env) -> None:  # type: ignore[no-untyped-def]
    """A deferred sensor outlives a broker restart: it keeps polling and fires on data sent after it."""
    conn_env(CONN_ID, broker.uri)
    s = streams.stream()
    trigger = RabbitMQStreamNewDataTrigger(
        stream=s, consumer_name="etl", poll_interval=0.2, rabbitmq_stream_conn_id=CONN_ID
    )

    async def scenario() -> dict[str, Any]:
        task = asyncio.ensure_future(first_event(trigger, timeout=180))
        await asyncio.sleep(1)
        assert not task.done()  # empty stream: nothing to fire on
        try:
            await asyncio.to_thread(broker_down)
            await asyncio.sleep(2)
            assert not task.done(), task.exception() if task.done() else None  # waiting, not failed
        finally:
            await asyncio.to_thread(broker_up)
        await asyncio.to_thread(publish, broker, s, [b"x"] * 5)
        return await asyncio.wait_for(task, 120)

    try:
        payload = asyncio.run(scenario())
    finally:
        broker_up()
    assert payload["status"] == "success"
    assert payload["partitions"] == {s: {"tail": 5, "watermark": None, "first": 0, "lag": 5}}
