"""Routing to a super stream's partition streams: hash, key (the broker's bindings) or custom.

`hash` is murmur3 as the Java and Go clients compute it (never rstream's super stream producer,
which hashes differently); `key` asks the broker which partitions a routing key is bound to (once
per key); `custom` calls a `partitionerClass` (`extensions.Partitioner`). `Router.group` splits one
send into the messages for each partition stream, keeping their rows in the task for errors.

A retry that must put every message where an earlier try put it (a produce run's, a Spark task's
with a producer name: the broker drops a re-sent message only on the same partition stream under
the same publishing id) routes over that try's partition list (`Router.pin`), not today's: hash
routing over a partition added since would move most keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mmh3

from pyspark_rmqs.broker.client import AsyncBrokerClient
from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.recovery import ROUTING_CALL_TIMEOUT_S
from pyspark_rmqs.core.errors import ConfigurationError, RoutingChangedError

HASH_SEED = 104729


def hash_partition(routing_key: str, partitions: int) -> int:
    """The partition the Java and Go clients choose: murmur3 x86 32-bit, seed 104729, UTF-8, unsigned."""
    return mmh3.hash(routing_key.encode("utf-8"), HASH_SEED, signed=False) % partitions


def load_partitioner(path: str) -> Callable[[str, list[str]], Any]:
    """A custom partitioner (`partitionerClass`): `partition(routing_key, partitions)`."""
    from pyspark_rmqs.core.extensions import Partitioner, load

    partitioner: Partitioner = load(path, "partitionerClass", Partitioner)
    return partitioner.partition


@dataclass
class Group:
    """The messages of one send() bound for one partition stream, with their rows in the task."""

    messages: list[bytes]
    filters: list[str | None] | None
    rows: list[int]

    def add(self, message: bytes, filter_value: str | None, row: int) -> None:
        self.messages.append(message)
        if self.filters is not None:
            self.filters.append(filter_value)
        self.rows.append(row)


class Router:
    """Where each message goes: the stream itself, or partition streams of a super stream."""

    def __init__(
        self,
        conn: Any,
        target: str,
        *,
        superstream: bool,
        strategy: str = "hash",
        partitioner_class: str | None = None,
    ) -> None:
        self.conn = conn
        self.target = target
        self.superstream = superstream
        self.strategy = strategy
        self.partitions: list[str] = []
        self._pinned: frozenset[str] | None = None  # an earlier try's partitions (`pin`)
        self._routes: dict[str, list[str]] = {}
        self._custom = load_partitioner(partitioner_class) if partitioner_class else None
        if superstream:
            aio = AsyncBrokerClient(conn, patient=True)  # executors: the driver reached the broker
            self.partitions = run_sync(aio.partitions(target), ROUTING_CALL_TIMEOUT_S, "partitions")

    def pin(self, partitions: Sequence[str], why: str) -> None:
        """Route as an earlier try did, over its `partitions` (in its order) whatever was added since:
        hash and custom choose among them; key keeps, of the partition streams a key is bound to,
        those among them (all of them for a key bound to none: that try stopped before such a
        message, `route` raised). A partition of theirs the super stream no longer has: a
        `RoutingChangedError` (`why` says whose try it was), before anything is sent."""
        if not self.superstream:
            return
        gone = [p for p in partitions if p not in self.partitions]
        if gone:
            raise RoutingChangedError(
                f"partition stream(s) {gone} of super stream '{self.target}' that {why} routed to are "
                f"no longer part of it (its partitions now: {self.partitions}): routed over the others, "
                "re-sent messages would reach other partition streams under other publishing ids, and "
                "the broker would drop some as re-sent and keep others twice. Bind the partition "
                "stream(s) again and retry"
            )
        self.partitions = list(partitions)
        self._pinned = frozenset(partitions)

    def route(self, routing_key: str | None, row: int = -1) -> list[str]:
        """The partition stream(s) a message with `routing_key` goes to."""
        if not self.superstream:
            return [self.target]
        if routing_key is None:
            where = f" (row {row})" if row >= 0 else ""
            raise ConfigurationError(
                f"a null routing_key{where}: writing to super stream '{self.target}' needs a routing_key "
                "column with a value in every row"
            )
        if self.strategy == "hash":
            return [self.partitions[hash_partition(routing_key, len(self.partitions))]]
        if self.strategy == "key":
            found = self._routes.get(routing_key)
            if found is None:
                aio = AsyncBrokerClient(self.conn, patient=True)
                found = run_sync(aio.route(routing_key, self.target), ROUTING_CALL_TIMEOUT_S, "route")
                self._routes[routing_key] = found
            if not found:
                raise ConfigurationError(
                    f"routing key '{routing_key}' matches no binding of super stream '{self.target}' "
                    "(routingStrategy=key routes by the broker's bindings)"
                )
            if self._pinned is not None:
                return [s for s in found if s in self._pinned] or found
            return found
        assert self._custom is not None
        chosen = self._custom(routing_key, list(self.partitions))
        streams = [chosen] if isinstance(chosen, str) else list(chosen)
        unknown = [x for x in streams if x not in self.partitions]
        if unknown or not streams:
            raise ConfigurationError(
                f"partitionerClass returned {streams!r} for key '{routing_key}'; valid partitions: "
                f"{self.partitions}"
            )
        return streams

    def group(
        self,
        messages: Sequence[bytes],
        routing_keys: Sequence[str | None] | None,
        filter_values: Sequence[str | None] | None,
        base: int,
    ) -> dict[str, Group]:
        """The messages of one send per partition stream, in order; rows numbered from `base`."""
        if not self.superstream:
            return {
                self.target: Group(
                    list(messages),
                    list(filter_values) if filter_values is not None else None,
                    list(range(base, base + len(messages))),
                )
            }
        if routing_keys is None:
            raise ConfigurationError(f"writing to super stream '{self.target}' needs a routing_key column")
        groups: dict[str, Group] = {}
        for i, m in enumerate(messages):
            for stream in self.route(routing_keys[i], base + i):
                group = groups.get(stream)
                if group is None:
                    group = groups[stream] = Group([], [] if filter_values is not None else None, [])
                group.add(m, filter_values[i] if filter_values is not None else None, base + i)
        return groups
