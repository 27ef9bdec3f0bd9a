"""`Target`: the one "exactly one of stream / superstream" check and the one partition lookup."""

import asyncio

import pytest

from pyspark_rmqs.core.errors import ConfigurationError, StreamNotFoundError
from pyspark_rmqs.core.target import Target


class _Client:
    def __init__(self, supers: dict[str, list[str]], streams: set[str]) -> None:
        self.supers, self.existing = supers, streams

    def partitions(self, superstream: str) -> list[str]:
        if superstream not in self.supers:
            raise StreamNotFoundError(f"super stream '{superstream}' does not exist")
        return self.supers[superstream]

    def stream_exists(self, stream: str) -> bool:
        return stream in self.existing


class _AsyncClient(_Client):
    async def partitions(self, superstream: str) -> list[str]:  # type: ignore[override]
        return _Client.partitions(self, superstream)

    async def stream_exists(self, stream: str) -> bool:  # type: ignore[override]
        return _Client.stream_exists(self, stream)


def test_exactly_one_of_stream_or_superstream() -> None:
    for kwargs in ({}, {"stream": "a", "superstream": "b"}):
        with pytest.raises(ConfigurationError, match=r"^give exactly one of 'stream' or 'superstream'$"):
            Target.of(**kwargs)
    with pytest.raises(ConfigurationError, match=r"^give exactly one of --stream or --superstream$"):
        Target.of(labels=("--stream", "--superstream"))
    s, ss = Target.of(stream="a"), Target.of(superstream="b")
    assert (s.name, s.is_super, s.stream, s.superstream, s.kw()) == ("a", False, "a", None, {"stream": "a"})
    assert (ss.name, ss.is_super, ss.stream, ss.superstream) == ("b", True, None, "b")
    assert ss.kw() == {"superstream": "b"} and ss.describe() == "super stream 'b'"
    assert s.describe() == "stream 'a'" and Target.of(stream="") == Target("", False)


def test_partition_lookup_sync_and_async() -> None:
    client = _Client({"orders": ["orders-0", "orders-1"]}, {"single"})
    aclient = _AsyncClient({"orders": ["orders-0", "orders-1"]}, {"single"})
    assert Target.of(superstream="orders").streams(client) == ["orders-0", "orders-1"]
    assert Target.of(stream="single").streams(client) == ["single"]
    assert asyncio.run(Target.of(superstream="orders").astreams(aclient)) == ["orders-0", "orders-1"]
    assert asyncio.run(Target.of(stream="single").astreams(aclient)) == ["single"]
    with pytest.raises(StreamNotFoundError, match=r"^stream 'nope' does not exist$"):
        Target.of(stream="nope").streams(client)
    with pytest.raises(StreamNotFoundError, match=r"^stream 'nope' does not exist$"):
        asyncio.run(Target.of(stream="nope").astreams(aclient))
    with pytest.raises(StreamNotFoundError, match="super stream 'x'"):
        Target.of(superstream="x").streams(client)


def test_a_missing_stream_can_say_where_its_name_came_from() -> None:
    client = _Client({"orders": ["orders-0"]}, set())
    hint = " (option 'stream')"
    with pytest.raises(StreamNotFoundError, match=r"^stream 'nope' does not exist \(option 'stream'\)$"):
        Target.of(stream="nope").streams(client, hint=hint)
    with pytest.raises(StreamNotFoundError, match=r"^stream 'nope' does not exist \(option 'stream'\)$"):
        asyncio.run(Target.of(stream="nope").astreams(_AsyncClient({}, set()), hint=hint))
    assert Target.of(superstream="orders").streams(client, hint=hint) == ["orders-0"]  # no check there
