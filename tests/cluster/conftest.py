"""Fixtures of the `cluster` tier (`make test-cluster`): a three-node cluster, streams on it, and
nodes brought back after a fault.

The tier is opt-in: its tests are skipped unless `RMQS_TEST_CLUSTER=1` (what `make test-cluster`
sets) or `RMQS_TEST_CLUSTER_URI` names a cluster, so a plain `pytest` over the suite never starts
three more brokers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from pyspark_rmqs.broker.client import BrokerClient
from tests.cluster.support import ClusterSettings, settings_from_env
from tests.support.broker import unique_name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/cluster/"):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster() -> ClusterSettings:
    """The cluster's settings; the local one is started (the nodes not running) first."""
    settings = settings_from_env()
    if not settings.external and os.environ.get("RMQS_TEST_CLUSTER") != "1":
        pytest.skip("the cluster tier: `make test-cluster` (RMQS_TEST_CLUSTER=1) or RMQS_TEST_CLUSTER_URI")
    if not settings.external:
        settings.up()
    return settings


@pytest.fixture
def local_cluster(cluster: ClusterSettings) -> Iterator[ClusterSettings]:
    """The local cluster, for tests that kill or pause its nodes; every node runs again afterwards."""
    if cluster.external:
        pytest.skip("RMQS_TEST_CLUSTER_URI: a cluster these tests must not kill nodes of")
    yield cluster
    cluster.up()


class ClusterStreams:
    """Uniquely named streams and super streams on the cluster, deleted at teardown."""

    def __init__(self, cluster: ClusterSettings) -> None:
        self.cluster = cluster
        self.client = BrokerClient(cluster.conn())
        self._streams: list[str] = []
        self._super: list[str] = []

    def stream(self, prefix: str = "c", *, members: int = 3, leader: int | None = None) -> str:
        """A stream with `members` members (its leader on node `leader` when given: created through
        a connection to that node, the broker's default `client-local` leader locator), once every
        member is online."""
        name = unique_name(prefix)
        client = self.client if leader is None else BrokerClient(self.cluster.conn(seeds=[leader]))
        client.create_stream(name, {"initial-cluster-size": str(members)})
        self._streams.append(name)
        self.cluster.wait_members(name, members)
        return name

    def super_stream(self, partitions: int = 3, prefix: str = "cs") -> tuple[str, list[str]]:
        name = unique_name(prefix)
        self.client.create_super_stream(name, partitions)
        self._super.append(name)
        parts = [f"{name}-{i}" for i in range(partitions)]
        for p in parts:
            self.cluster.wait_members(p)
        return name, parts

    def cleanup(self) -> None:
        for name in self._streams:
            self.client.delete_stream(name)
        for name in self._super:
            self.client.delete_super_stream(name)


@pytest.fixture
def cluster_streams(cluster: ClusterSettings) -> Iterator[ClusterStreams]:
    factory = ClusterStreams(cluster)
    yield factory
    if not cluster.external:
        cluster.up()  # a test that killed a node: deleting needs the stream's members back
    factory.cleanup()
