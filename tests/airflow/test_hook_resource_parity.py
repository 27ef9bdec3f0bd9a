"""The Airflow hook and the Dagster resource: the same calls, signatures and results.

Both are thin handles on the connector: every shared call is `pyspark_rmqs.runs.handle.StreamsHandle`'s,
written once, and each side only says where its connection comes from. So a user moving between
orchestrators types the same calls and gets the same values back, and a call written again in
one of them (a twin that could drift) fails here. Lives with the Airflow tests because Airflow
must be configured before its import.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk import BaseHook
from dagster import ConfigurableResource

from airflow_rmqs.hooks import RabbitMQStreamHook
from dagster_rmqs import RabbitMQStreamsResource
from pyspark_rmqs.core.errors import StreamNotFoundError
from pyspark_rmqs.runs.handle import StreamsHandle
from pyspark_rmqs.runs.watermarks import Watermarks
from tests.conftest import StreamFactory
from tests.dagster.conftest import resource_of
from tests.support.broker import BrokerSettings
from tests.support.data import publish

pytestmark = [pytest.mark.airflow, pytest.mark.dagster]

# What each side has because of its orchestrator, not because of the broker.
HOOK_ONLY = {
    "get_conn": "Airflow's hook protocol: the parsed connection",
    "aget_conn": "the same, on the triggerer's event loop",
    "test_connection": "Airflow's connection test button",
}
RESOURCE_ONLY = {
    "connection_options": "Dagster config -> the parsed connection (the hook's get_conn)",
    "stream_uri": "the asset identity Dagster metadata records (Airflow: airflow_rmqs.assets)",
}
METADATA_CALLS = ("watermarks", "tails", "stored_offsets", "lag", "lags")


PLATFORM = {RabbitMQStreamHook: BaseHook, RabbitMQStreamsResource: ConfigurableResource}


def public_calls(cls: type) -> dict[str, Callable[..., Any]]:
    """Public methods of `cls` and its bases, its platform base's and deprecated aliases aside."""
    platform = PLATFORM.get(cls, object).__mro__
    calls: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        if klass in platform:
            continue
        for name, fn in vars(klass).items():
            if inspect.isfunction(fn) and not name.startswith("_") and not hasattr(fn, "deprecated_for"):
                calls[name] = fn
    return calls


SHARED = public_calls(StreamsHandle)


def test_hook_and_resource_expose_the_same_calls_with_the_same_signatures() -> None:
    hook, resource = public_calls(RabbitMQStreamHook), public_calls(RabbitMQStreamsResource)
    assert HOOK_ONLY.keys() <= vars(RabbitMQStreamHook).keys()
    assert RESOURCE_ONLY.keys() <= vars(RabbitMQStreamsResource).keys()
    shared = set(hook) - set(HOOK_ONLY)
    assert shared == set(resource) - set(RESOURCE_ONLY) == set(SHARED)
    assert {*METADATA_CALLS, "store_watermarks", "publish", "read_batches", "create_stream"} <= shared
    for name in sorted(shared):
        h, r = inspect.signature(hook[name]), inspect.signature(resource[name])
        assert str(h) == str(r), f"{name}: hook{h} but resource{r}"
        assert inspect.iscoroutinefunction(hook[name]) == inspect.iscoroutinefunction(resource[name]), name
    for name in (*METADATA_CALLS, "store_watermarks"):
        assert f"a{name}" in shared, f"no async twin of {name}"
        assert str(inspect.signature(hook[f"a{name}"])) == str(inspect.signature(hook[name]))


def test_every_shared_call_is_the_one_in_streams_handle() -> None:
    """Neither side writes a shared call again: each is `StreamsHandle`'s function itself, or (for
    the hook's former keyword `consumer=`) a wrapper around it. A twin in either class fails here."""
    for cls in (RabbitMQStreamHook, RabbitMQStreamsResource):
        assert issubclass(cls, StreamsHandle), cls.__name__
        for name, fn in SHARED.items():
            found = inspect.getattr_static(cls, name)
            assert inspect.unwrap(found) is fn, f"{cls.__name__}.{name} is written again: use StreamsHandle's"
        assert not set(HOOK_ONLY) & set(SHARED) and not set(RESOURCE_ONLY) & set(SHARED)
        # each side provides its connection, sync and async (the triggerer's path must not block)
        assert {"_connection", "_aconnection"} <= vars(cls).keys(), cls.__name__
        assert not inspect.isabstract(cls), cls.__name__
    wrapped = {n for n in SHARED if inspect.getattr_static(RabbitMQStreamHook, n) is not SHARED[n]}
    assert wrapped == {"watermarks", "lag", "awatermarks", "alag"}  # the calls that took `consumer=`
    assert all(inspect.getattr_static(RabbitMQStreamsResource, n) is SHARED[n] for n in SHARED)


def test_hook_and_resource_return_equal_values_for_the_same_stream(
    broker: BrokerSettings, streams: StreamFactory
) -> None:
    name, parts = streams.super_stream(2)
    publish(broker, parts[0], [b"a"] * 7)
    publish(broker, parts[1], [b"b"] * 3)
    hook, resource = RabbitMQStreamHook(), resource_of(broker)
    hook.store_watermarks("par", {parts[0]: 4})
    resource.store_watermarks("par", {parts[1]: 0})  # each side sees what the other stored

    calls = [(c, () if c == "tails" else ("par",)) for c in METADATA_CALLS]
    for target in ({"superstream": name}, {"stream": parts[0]}):
        for call, args in calls:
            h = getattr(hook, call)(*args, **target)
            r = getattr(resource, call)(*args, **target)
            assert h == r and type(h) is type(r), (call, target, h, r)

    async def both(call: str, args: tuple[Any, ...], target: dict[str, str]) -> tuple[Any, Any]:
        return (
            await getattr(RabbitMQStreamHook(), f"a{call}")(*args, **target),
            await getattr(resource, f"a{call}")(*args, **target),
        )

    for call, args in calls:
        h, r = asyncio.run(both(call, args, {"superstream": name}))
        assert h == r == getattr(resource, call)(*args, superstream=name), call

    w = resource.watermarks("par", superstream=name)
    assert isinstance(w, Watermarks) and w.target == name and w.superstream
    for handle in (hook, resource):  # equal, and right
        assert handle.tails(superstream=name) == {parts[0]: 7, parts[1]: 3}
        assert handle.stored_offsets("par", superstream=name) == {parts[0]: 4, parts[1]: 0}
        assert handle.lag("par", superstream=name) == 4
        assert handle.lags("par", superstream=name) == {parts[0]: 2, parts[1]: 2}
    opts = {"superstream": name, "consumerName": "par"}
    assert hook.spark_options(**opts) == resource.spark_options(**opts)
    assert hook.spark_options(**opts)["superstream"] == name and "stream" not in hook.spark_options(**opts)


def test_hook_and_resource_manage_publish_and_read_alike(broker: BrokerSettings) -> None:
    hook, resource = RabbitMQStreamHook(), resource_of(broker)
    s, ss = f"par-{uuid.uuid4().hex[:8]}", f"parss-{uuid.uuid4().hex[:8]}"
    try:
        resource.create_stream(s)
        hook.create_super_stream(ss, 2)
        assert resource.tails(stream=s) == hook.tails(stream=s) == {s: 0}
        assert set(resource.tails(superstream=ss)) == {f"{ss}-0", f"{ss}-1"}
        assert hook.publish([b"a", "b"], stream=s) == {s: 2}
        assert resource.publish([{"value": b"c"}], stream=s) == {s: 1}
        read = [list(handle.read_batches(s, 1, 3)) for handle in (hook, resource)]
        assert [[v for b in batches for v in b["value"].to_pylist()] for batches in read] == [
            [b"b", b"c"]
        ] * 2
        assert read[0][0].schema == read[1][0].schema
        counts = resource.publish([{"value": b"x", "routing_key": "k"}], superstream=ss)
        assert sum(counts.values()) == 1 and sum(hook.tails(superstream=ss).values()) == 1
        resource.delete_stream(s)
        with pytest.raises(StreamNotFoundError):
            hook.tails(stream=s)
    finally:
        hook.delete_stream(s)
        resource.delete_super_stream(ss)


def test_a_missing_stream_fails_the_same_way_on_both(broker: BrokerSettings) -> None:
    """Every metadata call looks the stream up first (the core `Target`): a missing stream or super
    stream is a `StreamNotFoundError` naming it, never an empty or partial answer."""
    hook, resource = RabbitMQStreamHook(), resource_of(broker)
    missing = f"nope-{uuid.uuid4().hex[:8]}"
    for handle in (hook, resource):
        with pytest.raises(StreamNotFoundError, match=f"^stream '{missing}' does not exist$"):
            handle.tails(stream=missing)
        with pytest.raises(StreamNotFoundError, match=f"super stream '{missing}' does not exist"):
            handle.tails(superstream=missing)
        with pytest.raises(StreamNotFoundError, match=f"^stream '{missing}' does not exist$"):
            asyncio.run(handle.atails(stream=missing))
        for call in ("stored_offsets", "lag", "lags"):
            with pytest.raises(StreamNotFoundError, match=f"^stream '{missing}' does not exist$"):
                getattr(handle, call)("c", stream=missing)
        with pytest.raises(ValueError, match="exactly one of 'stream' or 'superstream'"):
            handle.tails()
