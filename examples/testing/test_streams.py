"""The plugin's fixtures and helpers alone: no Airflow, no Dagster, no Spark."""

from __future__ import annotations

import pytest

from pytest_rmqs import RabbitMQTestBroker

CREATED: list[str] = []


def test_a_fresh_stream_holds_what_was_published(rmqs_broker: RabbitMQTestBroker, rmqs_stream: str) -> None:
    assert rmqs_broker.read_arrow(stream=rmqs_stream).num_rows == 0
    assert rmqs_broker.publish([b"a", "b", {"value": b"c"}], stream=rmqs_stream) == {rmqs_stream: 3}
    table = rmqs_broker.read_arrow(stream=rmqs_stream)
    assert table.column("value").to_pylist() == [b"a", b"b", b"c"]
    assert table.column("offset").to_pylist() == [0, 1, 2]
    assert set(table.column("stream").to_pylist()) == {rmqs_stream}
    CREATED.append(rmqs_stream)


def test_the_stream_is_deleted_after_its_test(rmqs_broker: RabbitMQTestBroker, rmqs_stream: str) -> None:
    from pyspark_rmqs.errors import StreamNotFoundError

    assert CREATED and rmqs_stream != CREATED[0]
    with pytest.raises(StreamNotFoundError):
        rmqs_broker.read_arrow(stream=CREATED[0])
    assert rmqs_broker.read_arrow(stream=rmqs_stream).num_rows == 0


@pytest.mark.rmqs_superstream(partitions=2)
def test_a_super_stream_routes_by_key(rmqs_broker: RabbitMQTestBroker, rmqs_superstream: str) -> None:
    messages = [{"value": f"order-{i}", "routing_key": f"customer-{i % 7}"} for i in range(50)]
    counts = rmqs_broker.publish(messages, superstream=rmqs_superstream)
    assert sorted(counts) == [f"{rmqs_superstream}-0", f"{rmqs_superstream}-1"]
    assert sum(counts.values()) == 50
    table = rmqs_broker.read_arrow(superstream=rmqs_superstream, metadata_fields=["routing_key"])
    assert sorted(table.column("value").to_pylist()) == sorted(f"order-{i}".encode() for i in range(50))
    assert set(table.column("routing_key").to_pylist()) == {f"customer-{i}" for i in range(7)}


def test_the_options_reach_the_broker(rmqs_broker: RabbitMQTestBroker) -> None:
    assert set(rmqs_broker.options) >= {"endpoints", "username", "password", "vhost"}
    assert rmqs_broker.uri.startswith("rabbitmq-stream")
    assert "password" not in repr(rmqs_broker)
    name = rmqs_broker.create_stream()
    try:
        assert rmqs_broker.handle().tails(stream=name) == {name: 0}
    finally:
        rmqs_broker.delete_stream(name)
