"""Which node each role connects to, from a Metadata answer (the pure part of topology.py; the
cluster tier checks the same against a real three-node cluster)."""

from __future__ import annotations

import random

import pytest
from rstream import schema

from pyspark_rmqs.broker.topology import NO_LEADER, Node, Topology, node_of, parse_metadata
from pyspark_rmqs.core.errors import BrokerUnavailableError, StreamNotFoundError

N1, N2, N3 = Node("n1", 5552), Node("n2", 5553), Node("n3", 5554)


def _answer(leader: int, replicas: list[int], code: int = 1, stream: str = "s") -> schema.MetadataResponse:
    brokers = [schema.Broker(i, n.host, n.port) for i, n in enumerate([N1, N2, N3])]
    return schema.MetadataResponse(
        correlation_id=1,
        brokers=brokers,
        metadata=[schema.StreamMetadata(stream, code, leader, replicas)],
    )


def test_metadata_names_the_leader_and_the_replicas() -> None:
    t = parse_metadata("s", _answer(0, [1, 2]))
    assert t == Topology("s", N1, (N2, N3))
    assert t.members == (N1, N2, N3)


def test_writers_go_to_the_leader_readers_to_a_replica_then_the_leader() -> None:
    t = Topology("s", N1, (N2, N3))
    assert t.candidates("write") == [N1]
    seen = {tuple(t.candidates("read", random.Random(seed))) for seed in range(20)}
    assert all(order[-1] == N1 and set(order[:2]) == {N2, N3} for order in seen)
    assert len(seen) == 2, "readers of many partitions spread over the replicas"


def test_a_stream_without_replicas_is_read_from_its_leader() -> None:
    assert Topology("s", N1, ()).candidates("read") == [N1]


def test_no_leader_during_an_election_leaves_writers_nothing_and_readers_the_replicas() -> None:
    t = parse_metadata("s", _answer(NO_LEADER, [1, 2]))
    assert t.leader is None and t.candidates("write") == []
    assert set(t.candidates("read")) == {N2, N3}


def test_a_missing_stream_and_an_unavailable_one_are_told_apart() -> None:
    with pytest.raises(StreamNotFoundError, match="'s' does not exist"):
        parse_metadata("s", _answer(NO_LEADER, [], code=2))
    with pytest.raises(BrokerUnavailableError, match="'s' is not available"):
        parse_metadata("s", _answer(NO_LEADER, [], code=6))


def test_the_node_a_connection_landed_on_is_its_advertised_address() -> None:
    assert node_of({"advertised_host": "n2", "advertised_port": "5553"}) == N2
    assert node_of({"version": "3.9.0"}) is None
    assert node_of(None) is None
