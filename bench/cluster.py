"""On a three-node cluster: reading from a replica vs from the leader, and writing through a
non-leader node vs to the leader, as ratios; prints the node each publisher and reader used.

    .venv/bin/python -m bench.cluster [--messages N] [--partitions 3] [--rounds 3]

The cluster is `RMQS_TEST_CLUSTER_URI`'s, else the cluster tier's local one (tests/cluster/support.py:
started if needed, stream ports 6552-6554). A super stream of `--partitions` partitions (its leaders
where the broker puts them: printed; 4.0 put all three on the node that created them, although asked
for `queue-leader-locator=balanced`) gets N 100-byte messages per partition per round (key
routing), written to each partition's leader (what rmqs does) and then through another node (which
forwards every message to the leader); each partition is then read in full from a replica (what
rmqs does) and from its leader. Each side is the best of `--rounds`. One line per side, then:
`replica/leader read 0.94x; non-leader/leader write 0.30x` (above 1: the first is faster; measured
on the 2-core machine, three nodes sharing it, 2026-11-27).
Pinning the other node is the only thing changed from rmqs's own choice (`Topology.candidates`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

from bench.common import REPO
from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.placement import topology
from pyspark_rmqs.broker.reader import RangeReader, ReadSettings
from pyspark_rmqs.broker.topology import Node, Topology
from pyspark_rmqs.broker.writer import StreamProducer, WriteSettings
from pyspark_rmqs.options import ConnectionOptions, parse_connection_options

_real_candidates = Topology.candidates


def cluster_connection() -> ConnectionOptions:
    """RMQS_TEST_CLUSTER_URI's nodes (comma-separated URIs), else the cluster tier's local cluster
    (started through `python -m tests.cluster.support up`, the tier's home and ports)."""
    uris = os.environ.get("RMQS_TEST_CLUSTER_URI")
    if uris:
        return parse_connection_options({"uris": uris})
    env = {**os.environ, "RMQS_TEST_CLUSTER": "1"}
    subprocess.run([sys.executable, "-m", "tests.cluster.support", "up"], check=True, cwd=REPO, env=env)
    port = int(os.environ.get("RMQS_TEST_CLUSTER_STREAM_PORT", "6552"))
    return parse_connection_options(
        {
            "endpoints": ",".join(f"127.0.0.1:{port + i}" for i in range(3)),
            "username": "guest",
            "password": "guest",
        }
    )


def members(conn: ConnectionOptions, stream: str) -> Topology:
    """The stream's topology once a leader and two replicas are online."""
    for _ in range(300):
        topo: Topology = run_sync(topology(conn, stream), 60)[0]
        if topo.leader is not None and len(topo.replicas) >= 2:
            return topo
        time.sleep(0.2)
    raise RuntimeError(f"'{stream}' did not get a leader and two replicas within 60 s")


@contextmanager
def pinned(kind: str) -> Iterator[None]:
    """rmqs's choice ("rmqs"), or the other one: readers on the leader ("leader"), writers on a
    node that is not the leader ("non-leader")."""
    if kind == "rmqs":
        yield
        return

    def candidates(self: Topology, role: str, rng: object = None) -> list[Node]:
        order = _real_candidates(self, role)  # type: ignore[arg-type]
        if role == "read" and kind == "leader" and self.leader is not None:
            return [self.leader]
        if role == "write" and kind == "non-leader" and self.replicas:
            return [self.replicas[0]]
        return order

    with mock.patch.object(Topology, "candidates", candidates):
        yield


def _write(
    conn: ConnectionOptions, superstream: str, parts: int, n: int
) -> tuple[float, dict[str, Node | None]]:
    keys = [str(i % parts) for i in range(10_000)]
    body = [b"x" * 100] * 10_000
    started = time.perf_counter()
    with StreamProducer(
        conn, superstream, superstream=True, settings=WriteSettings(routing_strategy="key")
    ) as p:
        for _ in range(0, n * parts, 10_000):
            p.send(body, routing_keys=keys)
        p.flush()
        nodes = p.nodes()
    return time.perf_counter() - started, nodes


def _read(conn: ConnectionOptions, stream: str, start: int, end: int) -> tuple[float, Node | None]:
    reader = RangeReader(conn, stream, start, end, ReadSettings())
    started = time.perf_counter()
    rows = sum(b.num_rows for b in reader)
    assert rows == end - start, f"{stream}: read {rows} of {end - start}"
    return time.perf_counter() - started, reader.nodes[0] if reader.nodes else None


def _best(rounds: int, side: Callable[[], float]) -> float:
    return min(side() for _ in range(rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000, help="messages per partition per round")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    conn = cluster_connection()
    client = BrokerClient(conn)
    name = f"bench-cluster-{uuid.uuid4().hex[:8]}"
    client.create_super_stream(name, a.partitions, {"queue-leader-locator": "balanced"})
    parts = [f"{name}-{i}" for i in range(a.partitions)]
    try:
        for p in parts:
            members(conn, p)
        total = a.messages * a.partitions
        write_s: dict[str, float] = {}
        for kind in ("rmqs", "non-leader"):
            times = []
            for _ in range(a.rounds):
                with pinned(kind):
                    took, nodes = _write(conn, name, a.partitions, a.messages)
                times.append(took)
            write_s[kind] = min(times)
            where = ", ".join(
                f"{s} -> {n} (leader {members(conn, s).leader})" for s, n in sorted(nodes.items())
            )
            side = "the leader" if kind == "rmqs" else "a non-leader node"
            print(f"write to {side}: {total / write_s[kind]:,.0f} msg/s; publishers on {where}")
        read_s: dict[str, float] = {}
        for kind in ("rmqs", "leader"):
            per_part: dict[str, float] = {}
            on: dict[str, Node | None] = {}
            for p in parts:
                tail = client.tail(p)
                start = max(0, tail - a.messages)
                samples = []
                for _ in range(a.rounds):
                    with pinned(kind):
                        took, on[p] = _read(conn, p, start, tail)
                    samples.append(took)
                per_part[p] = min(samples)
            read_s[kind] = sum(per_part.values())
            print(
                f"read from {'a replica' if kind == 'rmqs' else 'the leader'}: "
                f"{total / read_s[kind]:,.0f} msg/s; readers on "
                + ", ".join(f"{s} -> {n}" for s, n in sorted(on.items()))
            )
        print(
            f"replica/leader read {read_s['leader'] / read_s['rmqs']:.2f}x; "
            f"non-leader/leader write {write_s['rmqs'] / write_s['non-leader']:.2f}x "
            f"({a.partitions} partitions, {a.messages:,} messages each, best of {a.rounds})"
        )
    finally:
        client.delete_super_stream(name)


if __name__ == "__main__":
    main()
