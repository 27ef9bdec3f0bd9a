"""The campaign's hands on the real broker: streams, partitions, publishing, tails, watermarks, leases.

Publishing goes through rmqs's public `pyspark_rmqs.produce.publish` (hash routing for a super
stream); stream and super stream lifecycle through rmqs's broker client, and what the stream
protocol cannot do (bind a partition, close a connection) through the management HTTP API, as
an operator would. Nothing here is the code under test's mock: every call reaches the broker.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from urllib.parse import quote

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.routing import hash_partition
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.produce import publish
from tests.support.broker import BrokerSettings, management
from tests.support.data import conn_of

LEASE_CONNECTION_PREFIX = "rmqs-lease:"


def routing_key(seq: int) -> str:
    return f"k{seq}"


def partition_of(seq: int, partitions: Sequence[str]) -> str:
    """Where hash routing sends message `seq` (murmur3 as the Java and Go clients, rmqs's `hash`)."""
    return partitions[hash_partition(routing_key(seq), len(partitions))]


class BrokerOps:
    """Broker-side operations of one campaign sequence, on one broker."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.conn: ConnectionOptions = conn_of(settings)
        self.client = BrokerClient(self.conn)

    # ----------------------------------------------------------------------------- topology

    def create_stream(self, name: str) -> None:
        self.client.create_stream(name)

    def delete_stream(self, name: str, wait_s: float = 10.0) -> None:
        """Delete `name` and wait until the broker no longer has it (creating it again at once could
        otherwise find the old one: "already exists" is not an error to rmqs's client)."""
        self.client.delete_stream(name)
        deadline = time.monotonic() + wait_s
        while self.client.stream_exists(name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {name} still exists {wait_s} s after it was deleted")
            time.sleep(0.05)

    def create_super_stream(self, name: str, partitions: int) -> list[str]:
        self.client.create_super_stream(name, partitions)
        return self.client.partitions(name)

    def delete_super_stream(self, name: str, partitions: Iterable[str]) -> None:
        self.client.delete_super_stream(name)
        for p in partitions:  # bound later, by the management API: not the super stream's own
            self.client.delete_stream(p)

    def bind(self, superstream: str, stream: str, index: int) -> None:
        """Bind `stream` to the super stream exchange as partition `index` (routing key and order)."""
        vhost = quote(self.settings.vhost, safe="")
        management(
            "POST",
            f"bindings/{vhost}/e/{quote(superstream, safe='')}/q/{quote(stream, safe='')}",
            {"routing_key": str(index), "arguments": {"x-stream-partition-order": index}},
            port=self.settings.management_port,
        )

    def partitions(self, superstream: str) -> list[str]:
        return self.client.partitions(superstream)

    # ----------------------------------------------------------------------------- messages

    def publish(
        self, target: str, items: Sequence[tuple[int, bytes]], *, superstream: bool
    ) -> dict[str, int]:
        """Publish `(seq, body)` items in order, waiting for every confirm; counts per partition."""
        if superstream:
            messages = [{"value": body, "routing_key": routing_key(seq)} for seq, body in items]
            return publish(self.conn, messages, superstream=target)
        return publish(self.conn, [body for _, body in items], stream=target)

    def tails(self, streams: Iterable[str]) -> dict[str, int]:
        return self.client.tails(list(streams))

    def stored_on(self, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
        """The consumer's stored watermark per stream (None where it stored none)."""
        return self.client.stored_offsets(consumer, list(streams))

    # ------------------------------------------------------------------------------- leases

    def close_lease_connections(self, key: str, wait_s: float = 12.0) -> int:
        """Close the broker connections holding the lease named `key` (`rmqs-lease:<key>`), as an
        operator closing them in the management UI would; how many were closed."""
        wanted = f"{LEASE_CONNECTION_PREFIX}{key}"[:120]
        deadline = time.monotonic() + wait_s
        while True:
            found = [
                c["name"]
                for c in management("GET", "connections", port=self.settings.management_port) or []
                if (c.get("client_properties") or {}).get("connection_name") == wanted
            ]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the management API lists a connection with its first stats (up to 5 s)
        for name in found:
            management("DELETE", f"connections/{quote(name, safe='')}", port=self.settings.management_port)
        return len(found)
