"""A pooled connection on the node a reader or a writer of one stream should use.

Each (re)connection asks the stream's members afresh (the Metadata command, on the shared locator
connection): a leader that moved, or a member on a node that went down, is seen at the next
connection. Writers go to the leader, readers to a replica and then the leader (topology.py). A
node the seeds already lead to (every single-node broker) is reached through the seeds' connection,
so a broker that advertises a name the client cannot resolve (a container's host name, say) keeps
working on one node exactly as configured.

No member reachable is a transient error (`BrokerUnavailableError`): callers retry within the
recovery window (recovery.py), asking the metadata again each time, so a stale answer naming a node
that just died heals once the cluster elected a new leader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pyspark_rmqs.broker.connect import connect
from pyspark_rmqs.broker.pool import get_pool
from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.broker.topology import Node, Role, Topology, node_of, query_topology
from pyspark_rmqs.core.errors import BrokerTimeoutError, BrokerUnavailableError

log = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 30.0
_ROLE_WORDS = {"read": "read from", "write": "publish to"}


async def topology(conn: Any, stream: str) -> tuple[Topology, Node | None]:
    """The members of `stream`, and the node the seeds' locator connection is on (None: unknown)."""
    pool = get_pool()
    locator = await pool.locator(conn)
    try:
        topo = await asyncio.wait_for(query_topology(locator, stream), METADATA_TIMEOUT_S)
    except TimeoutError as e:
        await pool.drop_locator(conn)
        raise BrokerTimeoutError(f"members of stream '{stream}': no answer from the broker") from e
    return topo, node_of(locator.server_properties)


async def connect_for(conn: Any, stream: str, role: Role, name: str) -> RmqsClient:
    """A connection (from the pool: give it back with `release` or `discard`) on the node that
    `role` wants for `stream`: the leader to write, a replica (else the leader) to read."""
    pool = get_pool()

    async def through_seeds(node: Node) -> RmqsClient | None:
        client = await pool.acquire(conn, name)
        if node_of(client.server_properties) in (node, None):
            return client
        pool.release(conn, client)  # an idle seeds' connection on another node: dial `node`
        return None

    return await _on_member(conn, stream, role, through_seeds, lambda node: pool.acquire(conn, name, node))


async def open_for(conn: Any, stream: str, role: Role, name: str) -> RmqsClient:
    """`connect_for`, on a connection of its own (not pooled: the caller closes it)."""

    async def through_seeds(node: Node) -> RmqsClient | None:
        client = await connect(conn, name)
        if node_of(client.server_properties) in (node, None):
            return client
        await client.close()
        return None

    return await _on_member(conn, stream, role, through_seeds, lambda node: connect(conn, name, node))


async def _on_member(
    conn: Any,
    stream: str,
    role: Role,
    through_seeds: Callable[[Node], Awaitable[RmqsClient | None]],
    direct: Callable[[Node], Awaitable[RmqsClient]],
) -> RmqsClient:
    topo, seed_node = await topology(conn, stream)
    candidates = topo.candidates(role)
    if not candidates:
        raise BrokerUnavailableError(
            f"stream '{stream}' has no leader at the moment (the cluster is electing one, or more than "
            "half of the stream's members are down: a leader needs a majority of them); retrying as for "
            "a restarting broker"
        )
    errors: list[str] = []
    for node in candidates:
        if node == seed_node:
            client = await through_seeds(node)
            if client is not None:
                log.debug("%s '%s' on %s (through the seeds)", role, stream, node)
                return client
        try:
            client = await direct(node)
        except BrokerUnavailableError as e:
            errors.append(str(e))
            continue
        log.debug("%s '%s' on %s", role, stream, node)
        return client
    raise BrokerUnavailableError(
        f"no member of stream '{stream}' to {_ROLE_WORDS[role]} answered at its advertised address "
        f"({'; '.join(errors)}); if the brokers advertise addresses this client cannot reach (a load "
        "balancer, NAT, containers), map them with the addressResolverClass option"
    )


async def probe_locator(conn: Any, stream: str) -> tuple[RmqsClient, Node | None]:
    """A shared connection that can subscribe to `stream` (a node hosting a member of it) for short
    probes: the seeds' locator when its node is a member (every single-node broker), else a locator
    on a member; returns it with the node it was opened for (None: the seeds' locator)."""
    topo, seed_node = await topology(conn, stream)
    pool = get_pool()
    members = topo.members
    if seed_node is None or seed_node in members or not members:
        return await pool.locator(conn), None
    errors: list[str] = []
    for node in topo.candidates("read"):
        try:
            return await pool.locator(conn, node), node
        except BrokerUnavailableError as e:
            errors.append(str(e))
    raise BrokerUnavailableError(f"no member of stream '{stream}' answered ({'; '.join(errors)})")
