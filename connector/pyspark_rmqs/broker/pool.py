"""A per-process cache of broker connections keyed by connection settings and node.

Metadata calls share one "locator" connection per settings (on the seeds), and probes that must
subscribe share one per node of a cluster; readers and writers borrow a dedicated connection (one
socket each, so partitions do not contend) to the node their role wants (placement.py), or to the
seeds, and return it. Idle connections, the shared ones included, are closed after `IDLE_SECONDS`
(60 s, or the environment's `RMQS_POOL_IDLE_SECONDS`: the pool is per process, so a process-wide
setting, not a read option). A forked Python worker starts with an empty pool: sockets and the loop
thread do not survive a fork. All methods run on one event loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import weakref
from collections import defaultdict
from typing import Any

from pyspark_rmqs.broker.connect import connect
from pyspark_rmqs.broker.lookups import Lookups
from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.broker.topology import Node


def idle_seconds(environ: Any = os.environ) -> float:
    """How long an unused pooled connection stays open: `RMQS_POOL_IDLE_SECONDS`, else 60 s.

    Shorter frees broker connections sooner after a job (the test suite waits on that); longer
    keeps them for jobs that come back after a pause."""
    raw = environ.get("RMQS_POOL_IDLE_SECONDS")
    if raw is None or raw.strip() == "":
        return 60.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"RMQS_POOL_IDLE_SECONDS={raw!r}: expected a number of seconds above 0 (default 60)")
    return value


IDLE_SECONDS = idle_seconds()


class ConnectionPool:
    def __init__(self) -> None:
        self._locators: dict[Any, RmqsClient] = {}
        # key -> when a caller last took that locator: one idle as long as a borrowed connection is
        # closed too (a reused Spark Python worker would otherwise hold it while it lives)
        self._locator_used: dict[Any, float] = {}
        self._lookups: dict[Any, Lookups] = {}
        self._idle: dict[Any, list[tuple[float, RmqsClient]]] = defaultdict(list)
        self._locks: dict[Any, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._reaper: asyncio.Task[None] | None = None
        self._reached: set[Any] = set()  # settings this process has connected with at least once
        # client -> the node it was opened for (None: the seeds), so `release` files it where it belongs
        self._nodes: weakref.WeakKeyDictionary[Any, Node | None] = weakref.WeakKeyDictionary()

    async def locator(self, conn: Any, node: Node | None = None) -> RmqsClient:
        """The shared metadata connection for these settings (on `node`, else on the seeds),
        reopened when it died."""
        key = (conn.cache_key(), node)
        async with self._locks[key]:
            client = self._locators.get(key)
            if client is None or not client.is_connection_alive():
                client = await connect(conn, "rmqs-locator", node)
                self._locators[key] = client
                self._reached.add(conn.cache_key())
            self._locator_used[key] = time.monotonic()
            self._start_reaper()
            return client

    def lookups(self, conn: Any) -> Lookups:
        """The coalescing metadata queue of these settings on this loop (on the seeds' locator)."""
        key = conn.cache_key()
        found = self._lookups.get(key)
        if found is None:
            found = self._lookups[key] = Lookups(lambda: self.locator(conn))
        return found

    async def drop_locator(self, conn: Any, node: Node | None = None) -> None:
        client = self._locators.pop((conn.cache_key(), node), None)
        self._locator_used.pop((conn.cache_key(), node), None)
        if client is not None:
            await _close(client)

    async def acquire(self, conn: Any, name: str = "rmqs", node: Node | None = None) -> RmqsClient:
        """A connection for one reader or writer alone, on `node` (else on the seeds); return it with
        `release`."""
        idle = self._idle.get((conn.cache_key(), node), [])
        while idle:
            _, client = idle.pop()
            if client.is_connection_alive():
                return client
            await _close(client)
        self._start_reaper()
        client = await connect(conn, name, node)
        self._reached.add(conn.cache_key())
        self._nodes[client] = node
        return client

    def reached(self, conn: Any) -> bool:
        """True once a connection with these settings succeeded: later failures are worth waiting out."""
        return conn.cache_key() in self._reached

    def release(self, conn: Any, client: RmqsClient) -> None:
        node = self._nodes.get(client)
        if client.is_connection_alive():
            self._idle[(conn.cache_key(), node)].append((time.monotonic(), client))
        else:
            self._nodes.pop(client, None)

    async def discard(self, client: RmqsClient) -> None:
        self._nodes.pop(client, None)
        await _close(client)

    async def evict_idle(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        closed = 0
        for key, client in list(self._locators.items()):
            # a locator with a request or probe subscription under way is in use whatever its age
            if now - self._locator_used.get(key, now) >= IDLE_SECONDS and not client.busy():
                del self._locators[key]
                del self._locator_used[key]
                await _close(client)
                closed += 1
        for key, items in list(self._idle.items()):
            keep: list[tuple[float, RmqsClient]] = []
            drop: list[RmqsClient] = []
            for t, c in items:
                if now - t < IDLE_SECONDS and c.is_connection_alive():
                    keep.append((t, c))
                else:
                    drop.append(c)
            # The idle list is replaced before the first await: `acquire` and `release` run while a
            # connection closes, and one handed out meanwhile must not be filed back as idle (two
            # writers on one connection: the broker refused the second's publisher id as taken).
            self._idle[key] = keep
            for c in drop:
                self._nodes.pop(c, None)
                await _close(c)
                closed += 1
        return closed

    async def close(self) -> None:
        for c in self._locators.values():
            await _close(c)
        for items in self._idle.values():
            for _, c in items:
                await _close(c)
        self._locators.clear()
        self._locator_used.clear()
        self._idle.clear()
        self._nodes.clear()

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(IDLE_SECONDS / 2)
            await self.evict_idle()


async def _close(client: RmqsClient) -> None:
    try:
        await asyncio.wait_for(client.close(), 5)
    except Exception:
        pass


# One pool per event loop, dropped with its loop (an id() could be reused by a later loop, whose
# sockets would then be mixed up with a closed loop's). A forked child has other loops.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ConnectionPool] = weakref.WeakKeyDictionary()


def get_pool() -> ConnectionPool:
    """The pool of the running loop (the loop thread, or a trigger's loop)."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = ConnectionPool()
    return pool
