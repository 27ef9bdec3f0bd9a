"""`pyspark_rmqs.broker.lookups` without a broker: `Lookups.partitions` (one PartitionsQuery per super
stream for the checks that asked before it was written, never a stale or failed one for a check that
began after it: the rule of every lookup), the same rule for single requests (`answers`), and
`leader_here` across a reopened metadata connection.
The wire-level counts against the real broker are in tests/airflow/test_trigger_sharing.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pyspark_rmqs.broker.lookups import Lookups


class Broker:
    """Answers each query with the partitions it holds when the query is written."""

    def __init__(self) -> None:
        self.parts = ["ss-0", "ss-1"]
        self.queries = 0
        self.fail_next = False

    async def query(self) -> list[str]:
        self.queries += 1
        answer = list(self.parts)
        await asyncio.sleep(0.01)  # on the wire
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("connection lost")
        return answer


def lookups() -> Lookups:
    async def no_locator() -> object:
        raise AssertionError("partitions() goes through the query it is given")

    return Lookups(no_locator)  # type: ignore[arg-type]


def test_checks_that_ask_together_share_one_query() -> None:
    async def scenario() -> None:
        lk, broker = lookups(), Broker()
        since = time.monotonic()
        answers = await asyncio.gather(*(lk.partitions("ss", since, broker.query) for _ in range(10)))
        assert broker.queries == 1
        assert answers == [["ss-0", "ss-1"]] * 10

    asyncio.run(scenario())


def test_a_check_that_began_after_the_query_was_written_sends_its_own() -> None:
    async def scenario() -> None:
        lk, broker = lookups(), Broker()
        first = asyncio.ensure_future(lk.partitions("ss", time.monotonic(), broker.query))
        await asyncio.sleep(0.001)  # the first query is written (its task ran) ...
        broker.parts.append("ss-2")  # ... then a partition is added ...
        later = await lk.partitions("ss", time.monotonic(), broker.query)  # ... then this check begins
        assert later == ["ss-0", "ss-1", "ss-2"] and broker.queries == 2
        assert await first == ["ss-0", "ss-1"]
        # another super stream is its own query
        await lk.partitions("other", time.monotonic(), broker.query)
        assert broker.queries == 3

    asyncio.run(scenario())


def test_a_failed_query_fails_its_askers_and_is_never_joined_again() -> None:
    async def scenario() -> None:
        lk, broker = lookups(), Broker()
        broker.fail_next = True
        since = time.monotonic()
        results = await asyncio.gather(
            *(lk.partitions("ss", since, broker.query) for _ in range(3)), return_exceptions=True
        )
        assert [type(r) for r in results] == [ConnectionError] * 3 and broker.queries == 1
        assert await lk.partitions("ss", since, broker.query) == ["ss-0", "ss-1"]  # same `since`: a new one
        assert broker.queries == 2

    asyncio.run(scenario())


def test_an_asker_cancelled_does_not_cancel_the_query_of_the_others() -> None:
    async def scenario() -> None:
        lk, broker = lookups(), Broker()
        since = time.monotonic()
        first = asyncio.ensure_future(lk.partitions("ss", since, broker.query))
        second = asyncio.ensure_future(lk.partitions("ss", since, broker.query))
        await asyncio.sleep(0.001)
        first.cancel()
        assert await second == ["ss-0", "ss-1"] and broker.queries == 1
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(scenario())


class Pipeline:
    """A metadata connection that answers each request with the stream's version when it is written."""

    def __init__(self) -> None:
        self.version = 0
        self.written: list[str] = []
        self.fail_next = False

    async def send_batch(self, batch: Any, requests: list[tuple[int, int, str, str]], window: int) -> None:
        self.written += [stream for _i, _kind, stream, _ref in requests]
        answers = [(index, (stream, self.version)) for index, _kind, stream, _ref in requests]
        await asyncio.sleep(0.01)  # on the wire
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("connection lost")
        for index, value in answers:
            batch.answer(index, value, None)


def test_requests_are_joined_while_queued_or_written_after_the_asker_began_and_never_once_failed() -> None:
    wire = Pipeline()

    async def locator() -> Pipeline:
        return wire

    async def ask(lk: Lookups, streams: list[str], since: float) -> list[Any]:
        return [value for value, _err in await lk.answers(1, streams, "", since, 5.0)]

    async def scenario() -> None:
        lk = Lookups(locator)  # type: ignore[arg-type]
        since = time.monotonic()
        together = await asyncio.gather(ask(lk, ["a", "b"], since), ask(lk, ["b", "c"], since))
        assert together == [[("a", 0), ("b", 0)], [("b", 0), ("c", 0)]] and wire.written == ["a", "b", "c"]
        assert await ask(lk, ["a"], since) == [("a", 0)] and len(wire.written) == 3  # written after `since`
        wire.version = 1  # a message or a store ...
        later = time.monotonic()  # ... then a check begins: it never gets an answer written before it
        assert await ask(lk, ["a", "b"], later) == [("a", 1), ("b", 1)] and len(wire.written) == 5
        wire.fail_next = True
        failed = time.monotonic()
        with pytest.raises(ConnectionError):
            await ask(lk, ["c"], failed)
        assert await ask(lk, ["c"], failed) == [("c", 1)] and wire.written[-2:] == ["c", "c"]

    asyncio.run(scenario())


class MetadataClient:
    """A metadata connection on `node`: stream 's' is led by n1 and replicated on n2."""

    def __init__(self, node: str) -> None:
        self.server_properties = {"advertised_host": node, "advertised_port": "5552"}
        self.metadata_requests = 0

        class Seq:
            def next(self) -> int:
                return 1

        self._corr_id_seq = Seq()

    async def sync_request(self, frame: object, **kw: object) -> object:
        from types import SimpleNamespace as NS

        self.metadata_requests += 1
        return NS(
            brokers=[NS(reference=1, host="n1", port=5552), NS(reference=2, host="n2", port=5552)],
            metadata=[NS(name="s", response_code=1, leader_ref=1, replicas_refs=[2])],
        )


def test_which_streams_are_led_here_is_asked_again_when_the_metadata_connection_changes() -> None:
    """Stored offsets are reused only where StreamStats comes from the leader, which depends on the
    node the metadata connection is on: a connection reopened (closed when idle, or lost) may land on
    another node, so what was known about the old one must not be reused for it."""
    current: list[MetadataClient] = [MetadataClient("n1")]

    async def locator() -> MetadataClient:
        return current[0]

    async def scenario() -> None:
        lk = Lookups(locator)  # type: ignore[arg-type]
        assert await lk.leader_here(["s"]) == {"s"}  # on the leader's node
        assert await lk.leader_here(["s"]) == {"s"} and current[0].metadata_requests == 1  # reused
        current[0] = MetadataClient("n2")  # reopened on the replica's node
        assert await lk.leader_here(["s"]) == set()
        assert current[0].metadata_requests == 1

    asyncio.run(scenario())
