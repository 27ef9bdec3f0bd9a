"""The cluster the `cluster` tier runs against: a local three-node one from scripts/broker.sh, or any
cluster named by `RMQS_TEST_CLUSTER_URI`, and the faults the tests inflict on its nodes.

The local cluster lives beside the suite's single-node broker: its own home
(`RMQS_TEST_CLUSTER_HOME`, default /var/cache/rmqs-cluster, its chroot copied from the single-node
broker's on first use) and ports (stream 6552-6554, stream TLS 6551-6549, AMQP 6672-6674,
management 16672-16674, distribution 26672-26674, epmd 4370; `RMQS_TEST_CLUSTER_STREAM_PORT` and
friends move them). `RMQS_TEST_CLUSTER_URI` is a comma-separated list of one
`rabbitmq-stream://user:password@host:port/vhost` per node: the topology tests run there; the fault
tests, which kill nodes, are skipped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlparse

from rstream import exceptions as rx
from rstream.client import Client

from pyspark_rmqs.broker.topology import Node, Topology
from pyspark_rmqs.core.errors import BrokerUnavailableError
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options
from tests.support.broker import BROKER_SH

NODES = 3
DEFAULT_HOME = "/var/cache/rmqs-cluster"
SUITE_BROKER_HOME = "/var/cache/rmqs-broker"


def _port(name: str, default: int) -> str:
    return os.environ.get(f"RMQS_TEST_CLUSTER_{name}", str(default))


@dataclass(frozen=True)
class ClusterSettings:
    """Where the cluster's nodes listen; `endpoints` is what a user passes as the `endpoints` option."""

    nodes: tuple[tuple[str, int], ...]
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    external: bool = False
    env: dict[str, str] = field(default_factory=dict)  # scripts/broker.sh's, for the local cluster

    @property
    def endpoints(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.nodes)

    def options(self, *, seeds: list[int] | None = None, **extra: str) -> dict[str, str]:
        """Spark / connection options; `seeds` limits the endpoints to those node numbers (1-based)."""
        nodes = self.nodes if seeds is None else tuple(self.nodes[i - 1] for i in seeds)
        return {
            "endpoints": ",".join(f"{h}:{p}" for h, p in nodes),
            "username": self.username,
            "password": self.password,
            "vhost": self.vhost,
            **extra,
        }

    def conn(self, *, seeds: list[int] | None = None, **extra: str) -> ConnectionOptions:
        return parse_connection_options(self.options(seeds=seeds, **extra))

    def uri(self, i: int) -> str:
        h, p = self.nodes[i - 1]
        user, vhost = f"{quote(self.username)}:{quote(self.password)}", quote(self.vhost, safe="")
        return f"rabbitmq-stream://{user}@{h}:{p}/{vhost}"

    def index(self, node: Node | None) -> int:
        """The node number (1-based) of an advertised node (the local cluster advertises its ports)."""
        assert node is not None, "no node"
        ports = [p for _, p in self.nodes]
        assert node.port in ports, f"{node} is not one of the cluster's nodes {self.nodes}"
        return ports.index(node.port) + 1

    # ---------------------------------------------------------------------------- broker.sh

    def sh(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RMQS_")} | self.env
        return subprocess.run(
            ["bash", str(BROKER_SH), *args], capture_output=True, text=True, timeout=timeout, env=env
        )

    def up(self) -> None:
        """Start every node that is not running (all of them the first time)."""
        done = self.sh("up", "--nodes", str(NODES))
        assert done.returncode == 0, f"broker.sh up --nodes {NODES} failed: {done.stderr[-3000:]}"

    def node_pids(self, i: int) -> list[int]:
        done = self.sh("pids", "--node", str(i), timeout=60)
        assert done.returncode == 0, done.stderr
        return [int(p) for p in done.stdout.split()]

    def kill(self, i: int) -> None:
        """kill -9 every process of node i (its epmd is the cluster's and stays)."""
        pids = self.node_pids(i)
        assert pids, f"node {i} has no process to kill"
        _signal(pids, signal.SIGKILL)

    def pause(self, i: int) -> list[int]:
        pids = self.node_pids(i)
        _signal(pids, signal.SIGSTOP)
        return pids

    def resume(self, pids: list[int]) -> None:
        _signal(pids, signal.SIGCONT)

    def status(self) -> str:
        return self.sh("status", timeout=60).stdout

    # ---------------------------------------------------------------------------- topology

    def topology(self, stream: str) -> Topology:
        """The stream's leader and replicas, straight from rstream (no rmqs code under test)."""
        return asyncio.run(self._topology(stream))

    async def _topology(self, stream: str) -> Topology:
        last: BaseException | None = None
        for host, port in self.nodes:  # the first node that answers
            client = Client(
                host, port, connection_name="rmqs-test-topology", frame_max=1_048_576, heartbeat=60
            )
            try:
                await client.start()
                await client.authenticate(vhost=self.vhost, username=self.username, password=self.password)
                try:
                    leader, replicas = await client.query_leader_and_replicas(stream)
                except rx.LeaderNotAvailable:
                    return Topology(stream, None, ())
                return Topology(
                    stream, Node(leader.host, leader.port), tuple(Node(r.host, r.port) for r in replicas)
                )
            except (OSError, rx.ServerError) as e:
                last = e
            finally:
                try:
                    await asyncio.wait_for(client.close(), 5)
                except Exception:
                    pass
        raise ConnectionError(f"no node of {self.nodes} answered: {last}")

    def wait_members(self, stream: str, members: int = NODES, timeout_s: float = 60) -> Topology:
        """The stream's topology once it has a leader and `members` members online."""
        return wait_for(
            lambda: t if (t := self.topology(stream)).leader and len(t.members) >= members else None,
            timeout_s,
            f"'{stream}' to have a leader and {members} members",
        )


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, TimeoutError, rx.ServerError, BrokerUnavailableError) as e:  # a node restarting
            last, value = e, None
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last error: {last})")


def settings_from_env() -> ClusterSettings:
    """`RMQS_TEST_CLUSTER_URI`'s cluster, else the local one (not started here)."""
    uris = [u.strip() for u in os.environ.get("RMQS_TEST_CLUSTER_URI", "").split(",") if u.strip()]
    if uris:
        parsed = [urlparse(u) for u in uris]
        first = parsed[0]
        vhost = unquote(first.path[1:]) if first.path and first.path != "/" else "/"
        return ClusterSettings(
            nodes=tuple((u.hostname or "localhost", u.port or 5552) for u in parsed),
            username=unquote(first.username or "guest"),
            password=unquote(first.password or "guest"),
            vhost=vhost or "/",
            external=True,
        )
    stream = int(_port("STREAM_PORT", 6552))
    env = {
        "RMQS_BROKER_HOME": os.environ.get("RMQS_TEST_CLUSTER_HOME", DEFAULT_HOME),
        "RMQS_STREAM_PORT": str(stream),
        "RMQS_STREAM_TLS_PORT": _port("STREAM_TLS_PORT", stream - 1),
        "RMQS_AMQP_PORT": _port("AMQP_PORT", 6672),
        "RMQS_MANAGEMENT_PORT": _port("MANAGEMENT_PORT", 16672),
        "RMQS_EPMD_PORT": _port("EPMD_PORT", 4370),
        # No debootstrap when the suite's broker is installed: its chroot is copied (not shared).
        "RMQS_BROKER_COPY_FROM": os.path.join(
            os.environ.get("RMQS_BROKER_HOME", SUITE_BROKER_HOME), "trixie"
        ),
    }
    if "RMQS_BROKER_MODE" in os.environ:
        env["RMQS_BROKER_MODE"] = os.environ["RMQS_BROKER_MODE"]
    return ClusterSettings(nodes=tuple(("127.0.0.1", stream + i) for i in range(NODES)), env=env)


def main(argv: list[str]) -> int:
    """`python -m tests.cluster.support up|down|status|pids ...`: scripts/broker.sh on the tier's
    cluster (its home and ports), for `make test-cluster` and by hand."""
    settings = settings_from_env()
    if settings.external:
        print("RMQS_TEST_CLUSTER_URI is set: that cluster is not managed here")
        return 0
    args = argv or ["status"]
    if args[0] in {"up", "down", "restart", "status"} and "--nodes" not in args:
        args = [args[0], "--nodes", str(NODES), *args[1:]]
    done = settings.sh(*args)
    print(done.stdout, end="")
    print(done.stderr, end="", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
