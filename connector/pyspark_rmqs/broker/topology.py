"""Where a stream lives in a cluster: its leader and replicas, and which node each role connects to.

A RabbitMQ Streams cluster keeps each stream on a leader (the only member that writes) and
replicas (which serve reads). A subscription fails on a node that hosts no member of the stream
("stream not available"); a publisher works on any node, but a non-leader node forwards every
message to the leader, one more hop. So, as the official clients do (Java
`forceReplicaForConsumers`), publishers connect to the leader and readers to a replica, the leader
when no replica answers. The Metadata command names the members by their advertised host and port
(`stream.advertised_host` / `advertised_port`); it is asked again at every (re)connection, so a
leader that moved is found again. The configured endpoints are only seeds: where the first
metadata question goes.

This module is the pure part (parsing a Metadata answer, the order in which a role tries nodes);
connecting is `connect.py`, pooling `pool.py`, and `placement.py` ties them together.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from rstream import exceptions as rx
from rstream import schema

from pyspark_rmqs.core.errors import BrokerUnavailableError, StreamNotFoundError

Role = Literal["read", "write"]
NO_LEADER = 0xFFFF  # the Metadata answer's leader reference while a leader is being elected
_STREAM_DOES_NOT_EXIST = 2
_OK = 1


@dataclass(frozen=True, order=True)
class Node:
    """A broker node as the cluster advertises it: the address the Metadata command gives."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Topology:
    """One stream's members; `leader` is None while a new leader is being elected."""

    stream: str
    leader: Node | None
    replicas: tuple[Node, ...]

    @property
    def members(self) -> tuple[Node, ...]:
        return ((self.leader,) if self.leader is not None else ()) + self.replicas

    def candidates(self, role: Role, rng: random.Random | None = None) -> list[Node]:
        """The nodes `role` tries, in order: the leader to write; a replica to read (shuffled, so
        readers of many partitions spread over the replicas), then the leader."""
        if role == "write":
            return [self.leader] if self.leader is not None else []
        replicas = list(self.replicas)
        (rng or random).shuffle(replicas)
        return replicas + ([self.leader] if self.leader is not None else [])


def node_of(server_properties: dict[str, Any] | None) -> Node | None:
    """The node a connection landed on, from the advertised host and port the broker sends when the
    connection opens (None from a broker that does not send them)."""
    props = server_properties or {}
    host, port = props.get("advertised_host"), props.get("advertised_port")
    if not host or not port:
        return None
    try:
        return Node(str(host), int(port))
    except ValueError:
        return None


def parse_metadata(stream: str, response: Any) -> Topology:
    """The topology of `stream` from a MetadataResponse (rstream's `schema.MetadataResponse`)."""
    entry = next((m for m in response.metadata if m.name == stream), None)
    if entry is None:
        raise BrokerUnavailableError(f"the broker's metadata answer did not mention stream '{stream}'")
    if entry.response_code == _STREAM_DOES_NOT_EXIST:
        raise StreamNotFoundError(f"stream '{stream}' does not exist")
    brokers = {b.reference: Node(b.host, b.port) for b in response.brokers}
    leader = brokers.get(entry.leader_ref) if entry.leader_ref != NO_LEADER else None
    replicas = tuple(brokers[r] for r in entry.replicas_refs if r in brokers and brokers[r] != leader)
    if entry.response_code != _OK and leader is None and not replicas:
        raise BrokerUnavailableError(
            f"stream '{stream}' is not available (metadata response code {entry.response_code}): "
            "its members are starting or a leader is being elected"
        )
    return Topology(stream, leader, replicas)


async def query_topology(client: Any, stream: str) -> Topology:
    """Ask `client` (any node: a locator) for the members of `stream` with the Metadata command."""
    try:
        response = await client.sync_request(
            schema.Metadata(client._corr_id_seq.next(), streams=[stream]),
            resp_schema=schema.MetadataResponse,
            raise_exception=False,
        )
    except rx.StreamDoesNotExist as e:
        raise StreamNotFoundError(f"stream '{stream}' does not exist") from e
    return parse_metadata(stream, response)
