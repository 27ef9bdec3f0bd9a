"""Topology-aware connections on a real three-node cluster: publishers on the leader, readers on a
replica, endpoints as seeds only, probes on a member's node, and the load-balancer case through
`addressResolverClass` (every connection to one address; the client checks where it landed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from tests.cluster.balancer import Balancer
from tests.cluster.conftest import ClusterStreams
from tests.cluster.support import ClusterSettings

pytestmark = [pytest.mark.timeout(300)]


def _write(conn, stream: str, n: int, **settings) -> StreamProducer:  # type: ignore[no-untyped-def]
    p = StreamProducer(conn, stream, superstream=False, settings=WriteSettings(**settings))
    p.send([b"m%06d" % i for i in range(n)])
    p.flush()
    return p


def _read(conn, stream: str, end: int) -> tuple[list[bytes], RangeReader]:  # type: ignore[no-untyped-def]
    reader = RangeReader(conn, stream, 0, end, ReadSettings())
    values = [v for b in reader for v in b.column("value").to_pylist()]
    return values, reader


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_publisher_on_the_leader_reader_on_a_replica_whatever_the_seed(
    cluster: ClusterSettings, cluster_streams: ClusterStreams, seed: int
) -> None:
    s = cluster_streams.stream("topo")
    topo = cluster.topology(s)
    conn = cluster.conn(seeds=[seed])  # one seed: the route comes from the metadata, not from it
    p = _write(conn, s, 1000)
    try:
        assert p.nodes() == {s: topo.leader}, f"seed {seed}: publisher on {p.nodes()}, leader {topo.leader}"
    finally:
        p.close()
    values, reader = _read(conn, s, 1000)
    assert values == [b"m%06d" % i for i in range(1000)]
    assert reader.nodes and all(n in topo.replicas for n in reader.nodes), (reader.nodes, topo)


def test_a_stream_on_one_node_is_read_written_and_probed_through_a_seed_that_hosts_no_member(
    cluster: ClusterSettings, cluster_streams: ClusterStreams
) -> None:
    """A subscription fails on a node without a member of the stream: readers and tail probes must
    go to the member's node, whichever node the seeds lead to."""
    s = cluster_streams.stream("one", members=1, leader=1)
    topo = cluster.topology(s)
    assert topo.members == (topo.leader,) and cluster.index(topo.leader) == 1, topo
    conn = cluster.conn(seeds=[2, 3])
    p = _write(conn, s, 500, producer_name="one")
    p.close()
    assert BrokerClient(conn).tail(s) == 500  # a probe subscription (RabbitMQ 4.0: no committed offset)
    values, reader = _read(conn, s, 500)
    assert len(values) == 500 and reader.nodes == [topo.leader]


def test_readers_of_a_super_stream_spread_over_replicas_and_writers_follow_each_leader(
    cluster: ClusterSettings, cluster_streams: ClusterStreams
) -> None:
    name, parts = cluster_streams.super_stream(3)
    conn = cluster.conn()
    with StreamProducer(conn, name, superstream=True, settings=WriteSettings()) as p:
        p.send([b"v%d" % i for i in range(3000)], routing_keys=[str(i) for i in range(3000)])
        p.flush()
        on = p.nodes()
    for part in parts:
        topo = cluster.topology(part)
        assert on[part] == topo.leader, (part, on[part], topo)
        _, reader = _read(conn, part, BrokerClient(conn).tail(part))
        assert reader.nodes[0] in topo.replicas, (part, reader.nodes, topo)


@pytest.fixture
def balancer(cluster: ClusterSettings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Balancer]:
    lb = Balancer(list(cluster.nodes))
    monkeypatch.setenv("RMQS_TEST_BALANCER", lb.address)
    yield lb
    lb.close()


def test_behind_a_load_balancer_the_client_lands_on_the_right_nodes(
    cluster: ClusterSettings, cluster_streams: ClusterStreams, balancer: Balancer
) -> None:
    """Every connection goes through one address; the balancer picks the node. The client reads the
    node it reached from the connection properties and reconnects until it is the wanted one."""
    s = cluster_streams.stream("lb")
    topo = cluster.topology(s)
    conn = cluster.conn(seeds=[1], addressResolverClass="tests.cluster.balancer.ThroughBalancer")
    for _ in range(3):  # a round-robin balancer: a wrong node now and then
        p = _write(conn, s, 200)
        try:
            assert p.nodes() == {s: topo.leader}
        finally:
            p.close()
    values, reader = _read(conn, s, 600)
    assert len(values) == 600 and reader.nodes[0] in topo.replicas
    # The locator, the publisher and the reader at least, all through the balancer, to every node.
    assert sum(balancer.connections.values()) >= 3 and len(balancer.connections) == 3, balancer.connections
