"""Proves the fixtures: a real broker round trip on a stream and on a 3-partition super stream."""

from __future__ import annotations

import asyncio

from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)

from tests.support.broker import BrokerSettings

N = 10_000


async def _publish(s: BrokerSettings, stream: str, values: list[bytes]) -> None:
    async with Producer(s.host, s.port, username=s.username, password=s.password, vhost=s.vhost) as p:
        for i in range(0, len(values), 500):
            await p.send_batch(stream, [AMQPMessage(body=v) for v in values[i : i + 500]])
        # send_batch returns once sent; wait until every confirm arrived by publishing one more synchronously
        await p.send_wait(stream, AMQPMessage(body=b"end"))


async def _read(s: BrokerSettings, stream: str, count: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: AMQPMessage, ctx: MessageContext) -> None:
        got.append((ctx.offset, bytes(msg.body)))
        if len(got) >= count:
            done.set()

    async with Consumer(s.host, s.port, username=s.username, password=s.password, vhost=s.vhost) as c:
        await c.subscribe(
            stream,
            on_message,
            decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
        )
        await asyncio.wait_for(done.wait(), timeout=60)
    return got[:count]


def test_stream_round_trip(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name = streams.stream()
    values = [f"m-{i}".encode() for i in range(N)]
    asyncio.run(_publish(broker, name, values))
    got = asyncio.run(_read(broker, name, N + 1))
    assert [o for o, _ in got] == list(range(N + 1))
    assert [v for _, v in got] == [*values, b"end"]


def test_super_stream_round_trip(broker: BrokerSettings, streams) -> None:  # type: ignore[no-untyped-def]
    name, partitions = streams.super_stream(3)
    assert partitions == [f"{name}-0", f"{name}-1", f"{name}-2"]
    per_partition = {p: [f"{p}:{i}".encode() for i in range(N // 3)] for p in partitions}
    for p, values in per_partition.items():
        asyncio.run(_publish(broker, p, values))
    for p, values in per_partition.items():
        got = asyncio.run(_read(broker, p, len(values) + 1))
        assert [o for o, _ in got] == list(range(len(values) + 1))
        assert [v for _, v in got] == [*values, b"end"]
