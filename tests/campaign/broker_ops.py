"""The campaign's hands on the real broker: streams, partitions, publishing, tails, watermarks, leases.

Publishing goes through rmqs's public `pyspark_rmqs.produce.publish` (hash routing for a super
stream); stream and super stream lifecycle through rmqs's broker client, and what the stream
protocol cannot do (bind a partition, close a connection) through the management HTTP API, as
an operator would. Nothing here is the code under test's mock: every call reaches the broker.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from urllib.parse import quote

from pyspark_rmqs.broker.client import BrokerClient
from pyspark_rmqs.broker.routing import hash_partition
from pyspark_rmqs.options import ConnectionOptions
from pyspark_rmqs.produce import publish
from pyspark_rmqs.runs.record import RUNS_STREAM, run_key
from tests.support.broker import BrokerSettings, management
from tests.support.data import conn_of, settled

LEASE_CONNECTION_PREFIX = "rmqs-lease:"
# Every stream of a sequence is created with tiny segments, so retention (which deletes whole
# segments, never the one being written) can truncate a stream of a few hundred short messages:
# the truncate rule sets a `max-length-bytes` policy, rolls a segment, and removes the policy.
SEGMENT_BYTES = 400
STREAM_ARGS = {"stream-max-segment-size-bytes": SEGMENT_BYTES}
# The campaign's own `rmqs.runs` (on its own broker: `recreate_runs_stream`): retention keeps about
# 200 KB of run records in segments of 25 KB, so `evict_records`' filler (and a busy campaign's own
# runs) remove consumers' newest records, as 1 GB of other runs would in a busy virtual host.
RUNS_STREAM_ARGS = {"max-length-bytes": 200_000, "stream-max-segment-size-bytes": 25_000}
FILLER_BODY = b'{"campaign-filler":"' + b"x" * 1000 + b'"}'  # no consumer's record: never matches one
FILLER_BATCH = 25  # filler messages per publish call: one segment


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
        self.client.create_stream(name, STREAM_ARGS)

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
        self.client.create_super_stream(name, partitions, STREAM_ARGS)
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

    def offsets_of(self, stream: str, bodies: Sequence[bytes], tail: int, since: int) -> list[int]:
        """The offsets of `bodies`, just published to `stream` in this order, which now ends at `tail`;
        none of them is below `since` (the tail before).

        Not `tail - len(bodies) + i` in general: offset-tracking chunks take offsets too, and every
        segment a stream starts begins with a snapshot of its tracked offsets, so a segment rolled
        between two chunks of one publish puts a gap inside it (often, with tiny segments). The first
        body's offset tells: where it is at `tail - len(bodies)` the bodies are contiguous."""
        n = len(bodies)
        found = self.client.find_message(stream, since, lambda b: b == bodies[0])
        if found is None:
            raise AssertionError(f"{bodies[0]!r} was published to {stream} but is not there")
        if found[0] == tail - n:
            return [tail - n + i for i in range(n)]
        out = [found[0]]
        for body in bodies[1:]:
            at = self.client.find_message(stream, out[-1] + 1, lambda b, body=body: b == body)  # type: ignore[misc]
            if at is None:
                raise AssertionError(f"{body!r} was published to {stream} but is not there")
            out.append(at[0])
        return out

    def firsts(self, streams: Iterable[str]) -> dict[str, int]:
        """The first offset retention kept, per existing stream."""
        return {s: b[0] for s, b in self.client.bounds(list(streams)).items() if b is not None}

    def settled_first(self, stream: str, stable_s: float = 0.3, wait_s: float = 5.0) -> int:
        """`stream`'s first offset once it stayed the same for `stable_s` (segments go in the
        background)."""
        return settled(lambda: self.firsts([stream])[stream], stable_s=stable_s, wait_s=wait_s, poll_s=0.05)

    # ---------------------------------------------------------------------------- retention

    def _policy(self, stream: str) -> str:
        vhost = quote(self.settings.vhost, safe="")
        return f"policies/{vhost}/{quote(f'campaign-retention-{stream}', safe='')}"

    def set_retention(self, stream: str, max_bytes: int) -> None:
        """A `max-length-bytes` policy on `stream` alone (management API, as an operator would)."""
        management(
            "PUT",
            self._policy(stream),
            {
                "pattern": f"^{re.escape(stream)}$",
                "apply-to": "queues",
                "priority": 100,
                "definition": {"max-length-bytes": max_bytes},
            },
            port=self.settings.management_port,
        )

    def clear_retention(self, stream: str) -> None:
        management("DELETE", self._policy(stream), port=self.settings.management_port)

    def stored_on(self, consumer: str, streams: Iterable[str]) -> dict[str, int | None]:
        """The consumer's stored watermark per stream (None where it stored none)."""
        return self.client.stored_offsets(consumer, list(streams))

    # --------------------------------------------------------------------------- run records

    def recreate_runs_stream(self) -> None:
        """Delete `rmqs.runs` and create it with `RUNS_STREAM_ARGS` (rmqs creates it only when
        missing, so its runs keep these); every record and pointer goes with it. Only on the
        campaign's own broker: the shared one's is every test's."""
        if self.client.stream_exists(RUNS_STREAM):
            self.delete_stream(RUNS_STREAM)
        self.client.create_stream(RUNS_STREAM, RUNS_STREAM_ARGS)

    def runs_first(self) -> int:
        """`rmqs.runs`' first offset kept (0 when it is missing or empty)."""
        return self.firsts([RUNS_STREAM]).get(RUNS_STREAM, 0)

    def settled_runs_first(self) -> int:
        """`runs_first` once it stayed the same for 0.15 s (retention removes segments in the
        background)."""
        return self.settled_first(RUNS_STREAM, stable_s=0.15) if self.runs_first() else 0

    def record_kept(self, consumer: str, target: str) -> bool:
        """Whether `rmqs.runs` still holds the newest record of `consumer` on `target`: its pointer
        is stored (the broker drops a pointer retention passed at its next segment roll) and the
        record, the first of its records at or after the pointer, is still there. Read here, not
        through rmqs's `record.latest`, which is what the campaign checks."""
        key = run_key(consumer, target)
        if not self.client.stream_exists(RUNS_STREAM):
            return False
        pointer = self.client.stored_offset(key, RUNS_STREAM)
        if pointer is None:
            return False
        first = self.runs_first()
        if pointer >= first:
            return True
        marker = b'"consumer":' + json.dumps(consumer).encode()
        target_marker = b'"target":' + json.dumps(target).encode()
        found = self.client.find_message(RUNS_STREAM, first, lambda b: marker in b and target_marker in b)
        return found is not None

    def fill_runs(self, batches: int) -> None:
        """Publish `batches` segments of filler into `rmqs.runs` (as other consumers' runs would)."""
        for _ in range(batches):
            publish(self.conn, [FILLER_BODY] * FILLER_BATCH, stream=RUNS_STREAM)

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
