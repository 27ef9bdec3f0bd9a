"""Triggers on a consumer's watermark: new data arrived, or lag fell below a bound.

They only compare tails with the broker-stored watermark (`awatermarks`, a few metadata calls on
one shared connection per event loop): nothing is consumed and no JVM starts, so they are cheap
enough for the triggerer to poll every few seconds.

A triggerer runs every trigger on one event loop. After its first check, each trigger polls on the
loop clock's grid of its `poll_interval` (at multiples of it), so the triggers of a triggerer with
the same interval check at the same moments and their requests go out together: one StreamStats
per stream per poll however many triggers watch it (`pyspark_rmqs.broker.lookups`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import conf
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from airflow_rmqs.hooks import RabbitMQStreamHook
from pyspark_rmqs.core.target import Target
from pyspark_rmqs.errors import RmqsError, classify
from pyspark_rmqs.watermarks import Watermarks


def watermark_payload(w: Watermarks) -> dict[str, Any]:
    """JSON-friendly view of a check: per-partition tail and watermark, and the pending ranges.

    `pending` is `{stream: [start, end)}`: what a read started now would cover.
    """
    return {
        "target": w.target,
        "superstream": w.superstream,
        "consumer": w.consumer,
        "total_lag": w.total_lag,
        "partitions": {
            p.stream: {"tail": p.tail, "watermark": p.stored, "first": p.first, "lag": p.lag}
            for p in w.partitions
        },
        "pending": {s: [start, end] for s, (start, end) in w.pending().items()},
    }


def aligned_delay(interval: float, now: float | None = None) -> float:
    """The wait until the next multiple of `interval` on the monotonic clock (never 0: at least a
    tenth of it). Triggers that poll alike then check together and share their requests."""
    if interval <= 0:
        return 0.0
    now = time.monotonic() if now is None else now
    delay = interval - (now % interval)
    return delay if delay >= interval / 10 else delay + interval


_heap_frozen = False


def freeze_triggerer_heap() -> bool:
    """`[rabbitmq_streams] triggerer_gc_freeze`: at the first rmqs trigger a process runs, move every
    object alive then into CPython's permanent generation (`gc.freeze()`), once per process.

    Why: a triggerer's trigger runner holds ~296,000 objects (~200,000 of them Airflow's before any
    trigger runs), and each full collection scans them all, stopping the loop every trigger shares
    for 200-290 ms on a 2-core machine (bench.triggerer, docs/performance.md). Frozen, they are never
    scanned again (they are still freed when no longer referenced); a full collection then scans
    what the triggerer made since. One full collection first, so no garbage is frozen with them
    (one such stop, at that first start).
    The price: a reference cycle among the frozen objects that becomes garbage later is never
    reclaimed. Process-wide, so off by default: the deployer turns it on. Returns whether it froze.
    """
    global _heap_frozen
    if _heap_frozen or not conf.getboolean("rabbitmq_streams", "triggerer_gc_freeze", fallback=False):
        return False
    _heap_frozen = True
    gc.collect()
    gc.freeze()
    return True


class _WatermarkPolling:
    """The polling loop shared by both triggers: transient broker errors are logged and retried."""

    log: Any
    consumer_name: str
    target: Target
    stream: str | None
    superstream: str | None
    poll_interval: float
    rabbitmq_stream_conn_id: str
    _hook: RabbitMQStreamHook | None = None

    def _set_target(
        self,
        consumer_name: str,
        stream: str | None,
        superstream: str | None,
        poll_interval: float,
        conn_id: str,
    ) -> None:
        self.target = Target.of(stream, superstream)  # fails here unless exactly one is given
        self.consumer_name = consumer_name
        self.stream = stream
        self.superstream = superstream
        self.poll_interval = float(poll_interval)
        self.rabbitmq_stream_conn_id = conn_id

    def _target_kwargs(self) -> dict[str, Any]:
        return {
            "consumer_name": self.consumer_name,
            "stream": self.stream,
            "superstream": self.superstream,
            "poll_interval": self.poll_interval,
            "rabbitmq_stream_conn_id": self.rabbitmq_stream_conn_id,
        }

    async def check(self) -> Watermarks:
        """One watermark snapshot (tails, stored offsets) on the running loop's shared connection."""
        if self._hook is None:
            self._hook = RabbitMQStreamHook(self.rabbitmq_stream_conn_id)
        return await self._hook.awatermarks(self.consumer_name, **self.target.kw(), polling=True)

    async def _checks(self) -> AsyncIterator[Watermarks]:
        """One snapshot per poll; retryable errors wait for the next poll, the others raise.

        Callers drop each snapshot before the next wait: a snapshot (one object per partition) alive
        through the interval is alive at the loop's next generation-1 collection, so CPython promotes
        it to the oldest generation, and a triggerer's many watchers then add up to full collections
        of the whole process that stop its loop (bench.orchestration --watchers, #33)."""
        freeze_triggerer_heap()
        while True:
            try:
                yield await self.check()
            except RmqsError as e:
                if not classify(e).retryable:  # the one retry decision, shared with operators and Dagster
                    raise
                self.log.warning(
                    "rmqs: watermark check failed, retrying in %.1f s: %s", self.poll_interval, e
                )
            await asyncio.sleep(aligned_delay(self.poll_interval))


class RabbitMQStreamNewDataTrigger(_WatermarkPolling, BaseEventTrigger):
    """Fires when at least `min_messages` were published after `consumer_name`'s watermark.

    Usable in an `AssetWatcher`: it keeps polling after an event and fires again only once a tail
    moved past the tails of the previous event, so pending data that a run has not consumed yet
    does not schedule one run per poll. Payload: `watermark_payload` (tail and watermark per
    partition stream, pending ranges, total lag).
    """

    def __init__(
        self,
        *,
        consumer_name: str,
        stream: str | None = None,
        superstream: str | None = None,
        min_messages: int = 1,
        poll_interval: float = 5.0,
        rabbitmq_stream_conn_id: str = RabbitMQStreamHook.default_conn_name,
    ) -> None:
        super().__init__()
        self._set_target(consumer_name, stream, superstream, poll_interval, rabbitmq_stream_conn_id)
        self.min_messages = max(1, int(min_messages))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {**self._target_kwargs(), "min_messages": self.min_messages},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        fired: dict[str, int] | None = None
        async for w in self._checks():
            event = None
            if w.total_lag >= self.min_messages:
                tails = w.tails()
                # the same pending data as the last event: wait for new messages
                if fired is None or any(t > fired.get(s, -1) for s, t in tails.items()):
                    fired = tails
                    event = TriggerEvent({"status": "success", **watermark_payload(w)})
            del w  # see _WatermarkPolling._checks: not held through the poll interval
            if event is not None:
                yield event


class RabbitMQStreamLagTrigger(_WatermarkPolling, BaseTrigger):
    """Fires once `consumer_name`'s total lag is at most `max_lag` (for deferrable sensors)."""

    def __init__(
        self,
        *,
        consumer_name: str,
        stream: str | None = None,
        superstream: str | None = None,
        max_lag: int = 0,
        poll_interval: float = 5.0,
        rabbitmq_stream_conn_id: str = RabbitMQStreamHook.default_conn_name,
    ) -> None:
        super().__init__()
        self._set_target(consumer_name, stream, superstream, poll_interval, rabbitmq_stream_conn_id)
        self.max_lag = max(0, int(max_lag))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {**self._target_kwargs(), "max_lag": self.max_lag},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for w in self._checks():
            done = w.total_lag <= self.max_lag
            event = TriggerEvent({"status": "success", **watermark_payload(w)}) if done else None
            del w  # see _WatermarkPolling._checks: not held through the poll interval
            if event is not None:
                yield event
                return
