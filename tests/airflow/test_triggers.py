"""Triggers: serialize() round trips, and run() driven by asyncio against the real broker."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest
from airflow.triggers.base import BaseEventTrigger, BaseTrigger

from airflow_rmqs.triggers import RabbitMQStreamLagTrigger, RabbitMQStreamNewDataTrigger
from pyspark_rmqs.core.errors import StreamNotFoundError
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = pytest.mark.airflow


def roundtrip(trigger: BaseTrigger) -> BaseTrigger:
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    return again


def test_triggers_round_trip_through_serialize() -> None:
    new = RabbitMQStreamNewDataTrigger(
        superstream="orders", consumer_name="etl", min_messages=10, poll_interval=2
    )
    again = roundtrip(new)
    assert isinstance(again, BaseEventTrigger)
    assert again.trigger_id is None and again.task_instance is None  # BaseTrigger.__init__ ran
    assert new.serialize()[1] == {
        "consumer_name": "etl",
        "stream": None,
        "superstream": "orders",
        "min_messages": 10,
        "poll_interval": 2.0,
        "rabbitmq_stream_conn_id": "rabbitmq_stream_default",
    }
    lag = roundtrip(
        RabbitMQStreamLagTrigger(stream="s", consumer_name="etl", max_lag=5, rabbitmq_stream_conn_id="x")
    )
    assert lag.serialize()[1]["max_lag"] == 5 and not isinstance(lag, BaseEventTrigger)
    with pytest.raises(ValueError, match="exactly one of"):
        RabbitMQStreamLagTrigger(consumer_name="etl")


def test_polling_waits_out_retryable_errors_and_ends_on_the_others() -> None:
    """The triggers retry exactly what `errors.classify` calls retryable (no broker needed)."""
    from pyspark_rmqs.core.errors import BrokerUnavailableError, ConfigurationError
    from pyspark_rmqs.runs.watermarks import PartitionWatermark, Watermarks

    ready = Watermarks("s", "etl", False, (PartitionWatermark("s", 0, 3, None),))

    def scripted(*outcomes: Any) -> RabbitMQStreamLagTrigger:
        trigger = RabbitMQStreamLagTrigger(stream="s", consumer_name="etl", max_lag=5, poll_interval=0.01)
        queue = list(outcomes)

        async def check() -> Watermarks:
            outcome = queue.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        trigger.check = check  # type: ignore[method-assign]
        return trigger

    payload = asyncio.run(first_event(scripted(BrokerUnavailableError("blip"), ready)))
    assert payload["total_lag"] == 3  # the transient error was logged and polled again
    with pytest.raises(ConfigurationError, match="bad"):
        asyncio.run(first_event(scripted(ConfigurationError("bad"), ready)))


@pytest.mark.parametrize("kind", ["new-data", "lag"])
def test_a_trigger_holds_no_snapshot_while_it_waits_for_its_next_poll(kind: str) -> None:
    """A check's snapshot (one object per partition) must die before the wait: held through the poll
    interval it is promoted to CPython's oldest generation, and a triggerer's watchers then add up to
    full collections that stop its loop (#33)."""
    import gc
    import weakref

    from pyspark_rmqs.runs.watermarks import PartitionWatermark, Watermarks

    refs: list[weakref.ref[Watermarks]] = []
    waits: list[bool] = []

    if kind == "new-data":
        trigger: Any = RabbitMQStreamNewDataTrigger(stream="s", consumer_name="etl", poll_interval=0.05)
    else:
        trigger = RabbitMQStreamLagTrigger(stream="s", consumer_name="etl", max_lag=0, poll_interval=0.05)

    async def check() -> Watermarks:
        if refs:  # the previous snapshot is gone by the time the next poll starts
            waits.append(refs[-1]() is None)
        w = Watermarks("s", "etl", False, (PartitionWatermark("s", 0, 3 + len(refs), None),))
        refs.append(weakref.ref(w))
        return w

    trigger.check = check

    async def drain() -> None:
        async for _event in trigger.run():  # the new-data trigger fires at every check (tails grow)
            pass

    async def scenario() -> None:
        task = asyncio.ensure_future(drain())
        while len(refs) < 4:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    gc.disable()  # only references count, not a collection that happens to run
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
    assert len(waits) >= 3 and all(waits), waits


@pytest.mark.parametrize("setting", [None, "False", "True"])
def test_triggerer_gc_freeze_freezes_the_heap_once_at_the_first_trigger_and_only_when_set(
    setting: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[rabbitmq_streams] triggerer_gc_freeze` (docs/airflow.md): off by default; when True, the
    first trigger's run moves the heap into the permanent generation, and no later one does it again."""
    import gc

    from airflow_rmqs import triggers
    from pyspark_rmqs.runs.watermarks import PartitionWatermark, Watermarks

    if setting is None:
        monkeypatch.delenv("AIRFLOW__RABBITMQ_STREAMS__TRIGGERER_GC_FREEZE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__RABBITMQ_STREAMS__TRIGGERER_GC_FREEZE", setting)
    monkeypatch.setattr(triggers, "_heap_frozen", False)
    frozen_at_check: list[int] = []

    def trigger() -> RabbitMQStreamLagTrigger:
        t = RabbitMQStreamLagTrigger(stream="s", consumer_name="etl", max_lag=5)

        async def check() -> Watermarks:
            frozen_at_check.append(gc.get_freeze_count())
            return Watermarks("s", "etl", False, (PartitionWatermark("s", 0, 3, None),))

        t.check = check  # type: ignore[method-assign]
        return t

    assert gc.get_freeze_count() == 0
    try:
        asyncio.run(first_event(trigger()))
        first = gc.get_freeze_count()
        made_since = [[] for _ in range(5_000)]  # alive through the second trigger's start
        asyncio.run(first_event(trigger()))
        assert gc.get_freeze_count() < first + len(made_since)  # once per process, not per trigger
    finally:
        gc.unfreeze()
    if setting == "True":
        assert first > 10_000 and frozen_at_check[0] > 10_000  # the heap, before the first check
    else:
        assert first == 0 and frozen_at_check == [0, 0]


async def first_event(trigger: BaseTrigger, timeout: float = 20) -> dict[str, Any]:
    gen = trigger.run()
    try:
        event = await asyncio.wait_for(anext(gen), timeout)
    finally:
        await gen.aclose()
    return event.payload


def test_new_data_trigger_fires_after_a_publish_and_once_per_arrival(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, parts = streams.super_stream(2)
    trigger = RabbitMQStreamNewDataTrigger(
        superstream=name, consumer_name="etl", min_messages=3, poll_interval=0.1
    )

    async def scenario() -> list[dict[str, Any]]:
        gen = trigger.run()
        events: list[dict[str, Any]] = []
        try:
            pending = asyncio.ensure_future(anext(gen))
            await asyncio.sleep(0.5)
            assert not pending.done()  # empty streams: nothing to fire on
            await asyncio.to_thread(publish, broker, parts[0], [b"a"] * 2)
            await asyncio.sleep(0.5)
            assert not pending.done()  # 2 < min_messages
            await asyncio.to_thread(publish, broker, parts[1], [b"b"] * 2)
            events.append((await asyncio.wait_for(pending, 10)).payload)
            again = asyncio.ensure_future(anext(gen))
            await asyncio.sleep(0.5)
            assert not again.done()  # same pending data: no second event
            await asyncio.to_thread(publish, broker, parts[1], [b"c"])
            events.append((await asyncio.wait_for(again, 10)).payload)
        finally:
            await gen.aclose()
        return events

    first, second = asyncio.run(scenario())
    assert first["status"] == "success" and first["total_lag"] == 4
    assert first["partitions"] == {
        parts[0]: {"tail": 2, "watermark": None, "first": 0, "lag": 2},
        parts[1]: {"tail": 2, "watermark": None, "first": 0, "lag": 2},
    }
    assert first["pending"] == {parts[0]: [0, 2], parts[1]: [0, 2]}
    assert second["partitions"][parts[1]]["tail"] == 3 and second["total_lag"] == 5


def test_new_data_trigger_counts_from_the_watermark(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    from airflow_rmqs.hooks import RabbitMQStreamHook

    s = streams.stream()
    publish(broker, s, [b"x"] * 10)
    RabbitMQStreamHook().store_watermarks("etl", {s: 6})
    payload = asyncio.run(first_event(RabbitMQStreamNewDataTrigger(stream=s, consumer_name="etl")))
    assert payload["partitions"] == {s: {"tail": 10, "watermark": 6, "first": 0, "lag": 3}}
    assert payload["pending"] == {s: [7, 10]}


def test_lag_trigger_fires_once_lag_is_low(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    from airflow_rmqs.hooks import RabbitMQStreamHook

    s = streams.stream()
    publish(broker, s, [b"x"] * 10)
    trigger = RabbitMQStreamLagTrigger(stream=s, consumer_name="etl", max_lag=2, poll_interval=0.1)

    async def scenario() -> dict[str, Any]:
        task = asyncio.ensure_future(first_event(trigger))
        await asyncio.sleep(0.5)
        assert not task.done()  # lag 10 > 2
        await RabbitMQStreamHook().astore_watermarks("etl", {s: 7})
        return await asyncio.wait_for(task, 10)

    payload = asyncio.run(scenario())
    assert payload["total_lag"] == 2 and payload["partitions"][s]["watermark"] == 7


def test_non_retryable_errors_end_the_trigger(broker: BrokerSettings) -> None:
    with pytest.raises(StreamNotFoundError, match="nope-"):
        asyncio.run(first_event(RabbitMQStreamNewDataTrigger(stream="nope-x1", consumer_name="c")))
