"""Coalesced metadata lookups of one event loop: the checks of many triggers share their requests.

A triggerer runs every deferred sensor and AssetWatcher on one event loop. Each check asks, per
partition stream, for StreamStats (first and committed chunk ids, for the tail) and for the
consumer's stored offset (QueryOffset). The protocol has no batched form of either, so the work per
check is one request per partition and kind; what can be saved is everything around them:

* Requests are not sent one by one: a check's requests (and those of every other check on the loop
  at that moment) are queued and written together on the next loop iteration, pipelined on the one
  metadata connection of the settings, at most `WINDOW` in flight (`RmqsClient.send_batch`).
* Identical requests are sent once: a lookup joins a request of the same kind, stream and consumer
  that is queued, or that was written at or after the moment the asking check began (`since`). The
  broker answers a connection's requests in order, so such an answer is as fresh as one the check
  would have sent itself: results stay exact, and triggers that poll together (they align their
  polls to the clock, see `airflow_rmqs.triggers`) fetch each stream's stats once per poll.
* Partitions of a super stream (`partitions`): one PartitionsQuery for the checks that asked
  before it was written, however many watch that super stream (written from a task on the next
  loop iteration, so the askers of one poll share it; a failed one is never joined).
* A polling check's whole stream-wide part (partitions, StreamStats, tails) is one run per target
  the same way (`join` / `begin`, used by `AsyncBrokerClient.polled_watermark_rows`): each check adds
  only its consumer's stored offsets. What a waiting check holds is what CPython promotes when it
  collects during the poll, and a triggerer's watchers all wait at once: about 20 objects each
  (its own requests and answers were about 100), so the promotions that make CPython collect the
  process's whole heap, stopping the loop, come several times more rarely (docs/performance.md).
* Tails (`TailCache`): a broker before 4.3 reports no committed offset in StreamStats, so the tail
  takes a subscription that delivers the stream's last chunk, 1.1-1.7 ms of the broker's CPU per
  stream (measured). Polling checks may reuse a tail while the stream's first and committed chunk
  ids are those it was measured at: no chunk was written since, so the tail is the same.
* Stored offsets (`OffsetCache`): every StoreOffset is a chunk in the stream (an offset-tracking
  entry), so while StreamStats shows the same first, committed and last chunk ids, no offset was
  stored and a polling check may reuse the stored offset read (after those stats) at those ids.
  Only where the stats come from the stream's leader, which answers QueryOffset: StreamStats is
  answered by the member on the connection's node, a replica may be behind (`leader_here`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pyspark_rmqs.broker.protocol import Batch, RmqsClient, future_failed

WINDOW = 256
"""Batched requests in flight per metadata connection. Measured (local 4.0 broker, 500 streams,
StreamStats + QueryOffset = 1,000 requests, 5 interleaved rounds, load 9.9 on 2 cores): window 16
90 ms median, 64 77 ms, 256 58 ms, 512 60 ms, 4,096 71 ms. Past a few hundred the broker's
socket buffer only holds requests that later checks' requests queue behind."""
TAIL_REUSE_S = 600.0
"""The longest a polling check reuses a tail or stored offset read at unchanged chunk ids
(jittered down to half, so entries read together expire apart): the backstop for a stream deleted
and created again under the same name that reached the same chunk ids, which ids cannot tell apart."""
TOPOLOGY_REUSE_S = 60.0
"""How long the streams found led from the metadata connection's node stay known (Metadata)."""
_FORGET_S = 5.0  # answers older are dropped (joins happen within a poll): they are GC work
T = TypeVar("T")


class Lookups:
    """The coalescing request queue of one connection settings on one loop (see the module)."""

    def __init__(self, locator: Callable[[], Awaitable[RmqsClient]]) -> None:
        self._locator = locator
        self._batch: Batch | None = None
        self._queued: list[tuple[int, int, str, str]] = []
        self._slots: dict[tuple[int, str, str], int] = {}  # the queued batch's: request -> index
        # Batches written in the last `_FORGET_S`, oldest first: (written at, batch, request -> index).
        # One entry per batch, not per request: what lives through a poll is what CPython promotes.
        self._written: list[tuple[float, Batch, dict[tuple[int, str, str], int]]] = []
        self._senders: set[asyncio.Task[None]] = set()
        self.tails = TailCache()
        self.offsets = OffsetCache()
        self._led_here: dict[str, tuple[bool, float]] = {}
        self._led_by: RmqsClient | None = None  # the metadata connection `_led_here` is about
        self._joined: dict[tuple[Any, ...], _Run] = {}  # key -> its latest run (`join` / `begin`)
        self._topology_lock = asyncio.Lock()
        self.probes = asyncio.Semaphore(16)  # tail subscriptions at a time: 256 ids per connection

    def lookup(self, kind: int, stream: str, reference: str, since: float) -> tuple[Batch, int]:
        """The batch and index that will hold the answer: a joined request, or a newly queued one."""
        key = (kind, stream, reference)
        if self._batch is not None and (index := self._slots.get(key)) is not None:
            return self._batch, index
        for written, batch, slots in reversed(self._written):  # the newest that has it counts
            if written < since:
                break
            if (index := slots.get(key)) is not None and not batch.failed:
                return batch, index
        if self._batch is None:
            self._batch = Batch(asyncio.get_running_loop())
            asyncio.get_running_loop().call_soon(self._flush)
        index = self._batch.add()
        self._queued.append((index, kind, stream, reference))
        self._slots[key] = index
        return self._batch, index

    def _flush(self) -> None:
        batch, requests, slots = self._batch, self._queued, self._slots
        self._batch, self._queued, self._slots = None, [], {}
        if batch is None:
            return
        now = time.monotonic()
        self._written = [w for w in self._written if w[0] > now - _FORGET_S]
        self._written.append((now, batch, slots))
        task = asyncio.get_running_loop().create_task(self._send(batch, requests))
        self._senders.add(task)
        task.add_done_callback(self._senders.discard)

    async def _send(self, batch: Batch, requests: list[tuple[int, int, str, str]]) -> None:
        try:
            client = await self._locator()
            await client.send_batch(batch, requests, WINDOW)
        except Exception as e:  # the waiting checks get it, and retry as for any metadata call
            batch.fail(e)

    async def answers(
        self, kind: int, streams: Sequence[str], reference: str, since: float, timeout: float
    ) -> list[tuple[Any, type[Exception] | None]]:
        """(value, error class) per stream, in order, answered after `since` (a monotonic time)."""
        slots = [self.lookup(kind, s, reference, since) for s in streams]
        batches = list({id(b): b for b, _ in slots}.values())
        try:
            async with asyncio.timeout(timeout):
                for b in batches:
                    await asyncio.shield(b.done)
        except TimeoutError:
            client = await self._locator()
            for b in batches:
                if not b.done.done():
                    client.forget(b)
                    b.fail(TimeoutError("no answer from the broker"))
            raise
        return [(b.values[i], b.errors[i]) for b, i in slots]

    async def partitions(self, superstream: str, since: float, query: Callable[[], Awaitable[T]]) -> T:
        """`query()` (the partitions of `superstream`), joined with one begun at or after `since`."""
        key = ("partitions", superstream)
        waiter = self.join(key, since)
        return await (waiter if waiter is not None else self.begin(key, query()))

    def join(self, key: tuple[Any, ...], since: float) -> asyncio.Future[Any] | None:
        """A future of `key`'s latest run, if a check that began at `since` may take its result.

        A run starts on the next loop iteration after `begin`, so the askers of one poll share it;
        one begun before `since` is not joined (its requests may be older than the asking check),
        nor a failed one. Each asker waits on a future of its own that the run settles: a cancelled
        check does not cancel the others' run, and a waiting asker holds one future. None: `begin`
        one (a caller makes its coroutine only then: a triggerer's checks mostly join)."""
        hit = self._joined.get(key)
        if hit is None or hit.begun < since or future_failed(hit.task):
            return None
        return hit.task if hit.task.done() else hit.waiter()

    def begin(self, key: tuple[Any, ...], work: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run `work` as `key`'s latest run (see `join`); a future of its result for this asker."""
        now = time.monotonic()
        self._joined = {k: v for k, v in self._joined.items() if v.begun > now - _FORGET_S}
        hit = self._joined[key] = _Run()
        hit.task = asyncio.get_running_loop().create_task(hit.run(work))
        hit.task.add_done_callback(_retrieved)
        return hit.waiter()

    async def leader_here(self, streams: Sequence[str]) -> set[str]:
        """The streams whose StreamStats the metadata connection's node answers from the leader:
        it has no replica, or its leader is on that node. One Metadata request for the streams not
        known for `TOPOLOGY_REUSE_S`; a stream the answer leaves unclear is left out (not reused)."""
        from pyspark_rmqs.broker.topology import node_of, parse_metadata

        now = time.monotonic()
        async with self._topology_lock:
            client = await self._locator()
            if client is not self._led_by:  # reopened (idle, or lost): maybe on another node
                self._led_here.clear()
                self._led_by = client
            unknown = [s for s in streams if self._led_here.get(s, (False, 0.0))[1] < now]
            if unknown:
                from rstream import schema

                response = await client.sync_request(
                    schema.Metadata(client._corr_id_seq.next(), streams=list(unknown)),
                    resp_schema=schema.MetadataResponse,
                    raise_exception=False,
                )
                here = node_of(client.server_properties)
                expires = now + TOPOLOGY_REUSE_S
                for s in unknown:
                    try:
                        topo = parse_metadata(s, response)
                    except Exception:
                        self._led_here[s] = (False, now)
                        continue
                    led = topo.leader is not None and (not topo.replicas or topo.leader == here)
                    self._led_here[s] = (led, expires)
        return {s for s in streams if self._led_here.get(s, (False, 0.0))[0]}


class _Run:
    """One run of `Lookups.begin`: when it began (inf until its task runs), and its askers."""

    __slots__ = ("begun", "task", "waiters")

    def __init__(self) -> None:
        self.begun = math.inf
        self.task: asyncio.Task[Any]
        self.waiters: list[asyncio.Future[Any]] = []

    def waiter(self) -> asyncio.Future[Any]:
        """A future of this run's result for one asker (cancelling it leaves the run alone)."""
        w: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.append(w)
        return w

    async def run(self, work: Awaitable[Any]) -> Any:
        self.begun = time.monotonic()  # what later askers' `since` is compared to
        try:
            result = await work
        except BaseException as e:
            for w in self.waiters:
                if w.done():
                    continue
                if isinstance(e, asyncio.CancelledError):
                    w.cancel()
                else:
                    w.set_exception(e)
                    w.exception()  # retrieved: its asker re-raises it, or was cancelled meanwhile
            self.waiters = []
            raise
        for w in self.waiters:
            if not w.done():
                w.set_result(result)
        self.waiters = []
        return result


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Its askers re-raise the error; asyncio must not also log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class OffsetCache:
    """Stored offsets per consumer and stream, valid while the stream's chunk ids stay the same."""

    def __init__(self) -> None:
        # consumer -> stream -> (chunk ids read at, stored offset or None, expires at)
        self._offsets: dict[str, dict[str, tuple[tuple[int, int, int], int | None, float]]] = {}

    def of(
        self, consumer: str, streams: Sequence[str], ids: Sequence[tuple[int, int, int] | None]
    ) -> tuple[list[int | None], list[int]]:
        """(stored offset or None per stream, the indexes not known at their `ids`): a check's whole
        lookup in one pass (a triggerer's watchers make it for every partition every poll)."""
        known = self._offsets.get(consumer, {})
        now = time.monotonic()
        out: list[int | None] = []
        need: list[int] = []
        for i, (s, key) in enumerate(zip(streams, ids, strict=True)):
            hit = known.get(s)
            if hit is None or key is None or hit[0] != key or hit[2] < now:
                need.append(i)
                out.append(None)
            else:
                out.append(hit[1])
        return out, need

    def put(self, stream: str, consumer: str, ids: tuple[int, int, int], offset: int | None) -> None:
        expires = time.monotonic() + TAIL_REUSE_S * random.uniform(0.5, 1.0)
        self._offsets.setdefault(consumer, {})[stream] = (ids, offset, expires)


class TailCache:
    """Tails measured per stream, valid while its (first, committed) chunk ids stay the same."""

    def __init__(self) -> None:
        self._tails: dict[str, tuple[int, int, int, float]] = {}
        self._probing: dict[tuple[str, int, int], asyncio.Future[int]] = {}
        self.probes = 0  # tail subscriptions made (benches and tests count them)

    def get(self, stream: str, first: int, committed: int) -> int | None:
        hit = self._tails.get(stream)
        if hit is None or hit[:2] != (first, committed) or hit[3] < time.monotonic():
            return None
        return hit[2]

    def put(self, stream: str, first: int, committed: int, tail: int) -> None:
        expires = time.monotonic() + TAIL_REUSE_S * random.uniform(0.5, 1.0)
        self._tails[stream] = (first, committed, tail, expires)

    async def measure(
        self, stream: str, first: int, committed: int, probe: Callable[[], Awaitable[int]]
    ) -> int:
        """`probe()` once for concurrent askers of the same stream at the same chunk ids."""
        key = (stream, first, committed)
        running = self._probing.get(key)
        if running is not None:
            return await asyncio.shield(running)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._probing[key] = fut
        try:
            self.probes += 1
            tail = await probe()
            self.put(stream, first, committed, tail)
            fut.set_result(tail)
            return tail
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: joiners re-raise it, nobody else must log it
            raise
        finally:
            self._probing.pop(key, None)
