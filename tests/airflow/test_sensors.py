"""Sensors in poke mode and deferred, against the real broker, without a metadata DB."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_rmqs.hooks import RabbitMQStreamHook
from airflow_rmqs.sensors import RabbitMQStreamLagSensor, RabbitMQStreamNewDataSensor
from airflow_rmqs.triggers import RabbitMQStreamLagTrigger, RabbitMQStreamNewDataTrigger
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.airflow


def test_new_data_sensor_pokes_and_pushes_the_pending_range(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(2)
    sensor = RabbitMQStreamNewDataSensor(
        task_id="s", superstream=name, consumer_name="etl", min_messages=5, poke_interval=0.1, timeout=30
    )
    assert not sensor.deferrable and not sensor.poke({}).is_done
    publish(broker, parts[0], [b"x"] * 5)
    RabbitMQStreamHook().store_watermarks("etl", {parts[0]: 1})  # lag 3 now
    assert not sensor.poke({}).is_done
    publish(broker, parts[1], [b"y"] * 2)
    xcom = sensor.execute({})
    assert xcom["total_lag"] == 5
    assert xcom["pending"] == {parts[0]: [2, 5], parts[1]: [0, 2]}
    assert xcom["partitions"][parts[0]] == {"tail": 5, "watermark": 1, "first": 0, "lag": 3}


def test_lag_sensor_pokes(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 10)
    sensor = RabbitMQStreamLagSensor(task_id="lag", stream=s, consumer_name="etl", max_lag="4", timeout=5)
    assert not sensor.poke({}).is_done
    RabbitMQStreamHook().store_watermarks("etl", {s: 5})
    assert sensor.execute({})["total_lag"] == 4


def test_deferrable_new_data_sensor_fires_after_a_publish(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    sensor = RabbitMQStreamNewDataSensor(
        task_id="s", stream=s, consumer_name="etl", deferrable=True, poke_interval=0.1, timeout=60
    )
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, RabbitMQStreamNewDataTrigger) and trigger.poll_interval == 0.1
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout is not None and deferred.value.timeout.total_seconds() == 60

    async def fire() -> dict[str, Any]:
        gen = trigger.run()
        try:
            pending = asyncio.ensure_future(anext(gen))
            await asyncio.sleep(0.3)
            assert not pending.done()
            await asyncio.to_thread(publish, broker, s, [b"new"] * 3)
            return (await asyncio.wait_for(pending, 10)).payload
        finally:
            await gen.aclose()

    xcom = sensor.execute_complete({}, asyncio.run(fire()))
    assert xcom["pending"] == {s: [0, 3]} and xcom["total_lag"] == 3
    # With data already there, a deferrable sensor finishes without deferring.
    assert sensor.execute({})["pending"] == {s: [0, 3]}


def test_deferrable_lag_sensor_defers_to_the_lag_trigger(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    s = streams.stream()
    publish(broker, s, [b"x"] * 3)
    sensor = RabbitMQStreamLagSensor(task_id="lag", stream=s, consumer_name="etl", max_lag=0, deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    assert isinstance(deferred.value.trigger, RabbitMQStreamLagTrigger)
    assert deferred.value.trigger.serialize()[1]["max_lag"] == 0
    with pytest.raises(AirflowFailException, match="without success"):
        sensor.execute_complete({}, {"status": "error"})


def test_sensor_failures_are_not_retried_and_hide_the_password(
    broker: BrokerSettings, conn_env, caplog
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    sensor = RabbitMQStreamNewDataSensor(task_id="s", stream="nope-s1", consumer_name="etl", deferrable=True)
    with pytest.raises(AirflowFailException, match="StreamNotFoundError: stream 'nope-s1' does not exist"):
        sensor.execute({})
    password = "wrong-Pw-3a8d1b"
    conn_env("rmqs_wrong", f"rabbitmq-stream://guest:{password}@{broker.host}:{broker.port}/%2F")
    sensor = RabbitMQStreamLagSensor(
        task_id="lag", stream="x", consumer_name="etl", rabbitmq_stream_conn_id="rmqs_wrong"
    )
    with pytest.raises(AirflowFailException, match="AuthenticationError") as failed:
        sensor.execute({})
    assert password not in str(failed.value) and password not in caplog.text
