"""A run's lease on a consumer (or producer) name: the broker's single active consumer, held open.

Two runs on one consumer name read the same range and both deliver it; comparing watermarks at
the end (the old check) catches that only after both sinks ran. The lease decides before reading.
It is a subscription, with `single-active-consumer` and the name, to the records stream
(`record.RUNS_STREAM`) on a connection of its own: the broker makes exactly one subscription of a
name active, promotes the next one when the holder unsubscribes or its connection dies (a killed
process: at once; a paused one: after missed heartbeats), and tells each the moment it becomes
active (ConsumerUpdate). The subscription has no credit, so it never receives a message.

Why not a stored value with an expiry: stored offsets have no compare-and-set, so two runs could
both "win"; the broker's group has one active member by construction, and expiry on a dead holder
comes from the connection itself instead of a clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from rstream import schema
from rstream.constants import OffsetType

from pyspark_rmqs.broker.loop import run_sync
from pyspark_rmqs.broker.placement import open_for
from pyspark_rmqs.broker.protocol import RmqsClient
from pyspark_rmqs.core.errors import ConfigurationError, ConsumerBusyError
from pyspark_rmqs.runs.record import RUNS_STREAM, ensure_stream

log = logging.getLogger(__name__)

MAX_NAME_BYTES = 256  # the broker's limit on a consumer (reference) name
DEFAULT_WAIT_S = 10.0


class Lease:
    """The lease on `name` while held; `release()` (or closing the process) gives it back."""

    def __init__(self, conn: Any, name: str, client: RmqsClient, sub: int) -> None:
        self.conn = conn
        self.name = name
        self._client = client
        self._sub = sub
        self.acquired_at = time.time()

    @property
    def held(self) -> bool:
        """Whether the lease's connection is still open (a broker restart ends the lease)."""
        c = self._client
        return c is not None and c.is_connection_alive()

    def release(self) -> None:
        """Give the lease back (idempotent; never raises: the broker ends it with the connection)."""
        client, self._client = self._client, None  # type: ignore[assignment]
        if client is None:
            return
        try:
            run_sync(_release(client, self._sub), 10.0, "release lease")
        except Exception:
            log.debug("releasing the lease on '%s' failed; the broker ends it with the connection", self.name)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a lease nobody released still ends with the process
        if getattr(self, "_client", None) is not None:
            try:
                self.release()
            except Exception:
                pass


def check_name(name: str, what: str = "consumer name") -> str:
    if not name:
        raise ConfigurationError(f"a {what} is needed to hold a run's lease")
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(
            f"{what} '{name[:40]}...' is {size} bytes; the broker allows at most {MAX_NAME_BYTES}"
        )
    return name


_closing: set[asyncio.Task[None]] = set()


async def _release(client: RmqsClient, sub: int) -> None:
    """Unsubscribe (the broker hands the lease on at once), then close the connection in the
    background: rstream's close waits 200 ms after the broker's answer, a cost no run should pay."""
    try:
        await asyncio.wait_for(client.unsubscribe(sub), 5.0)
    except Exception:  # the connection is going anyway: closing it ends the subscription too
        await _close(client, sub)
        return
    task = asyncio.get_running_loop().create_task(_close(client, sub))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _close(client: RmqsClient, sub: int) -> None:
    try:
        await asyncio.wait_for(client.unsubscribe(sub), 5.0)
    except Exception:
        pass
    try:
        await asyncio.wait_for(client.close(), 5.0)
    except Exception:
        pass


async def _acquire(conn: Any, stream: str, name: str, wait_s: float) -> tuple[RmqsClient, int] | None:
    """The active subscription of `name`'s group, or None when it did not become active in time."""
    # A subscription needs a node hosting a member of the stream (a replica, else the leader).
    client = await open_for(conn, stream, "read", f"rmqs-lease:{name}"[:120])
    active: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    sub = 0

    async def on_update(frame: schema.ConsumerUpdateResponse) -> None:
        if frame.subscription_id != sub:
            return
        # The protocol wants an answer either way; the subscription has no credit, so the offset
        # it names never matters.
        await client.consumer_update(frame.correlation_id, schema.OffsetSpecification(OffsetType.NEXT, 0))
        if frame.active and not active.done():
            active.set_result(True)

    client.add_handler(schema.ConsumerUpdateResponse, on_update, name="rmqs-lease")
    try:
        await client.subscribe(
            stream,
            sub,
            offset_spec=schema.OffsetSpec.from_params(OffsetType.NEXT, None),
            initial_credit=0,
            properties={"single-active-consumer": "true", "name": name},
        )
        await asyncio.wait_for(asyncio.shield(active), wait_s)
    except TimeoutError:
        await _close(client, sub)
        return None
    except BaseException:
        await _close(client, sub)
        raise
    return client, sub


def acquire(
    conn: Any,
    stream: str,
    name: str,
    *,
    wait_s: float = DEFAULT_WAIT_S,
    holder: str | Callable[[], str] = "",
    what: str = "",
) -> Lease:
    """Hold `name`'s lease, waiting up to `wait_s` for a holder to finish; else `ConsumerBusyError`.

    `what` says what the name stands for in messages (e.g. "consumer 'etl' on 'orders'"); `holder`
    describes who holds it now (read from the run record by the caller), or is a function asked
    for that only when the name is busy (the usual run pays no record read for it).
    """
    check_name(name, "lease name")
    if stream == RUNS_STREAM:  # the lease comes before the first record: on a new broker, create it
        ensure_stream(conn)
    got = run_sync(_acquire(conn, stream, name, wait_s), wait_s + 60.0, f"lease on '{name}'")
    if got is None:
        text = holder() if callable(holder) else holder
        who = f" ({text})" if text else ""
        raise ConsumerBusyError(
            f"{what or repr(name)} is held by another run{who}; waited {wait_s:.0f} s. This run read "
            "and stored nothing. Run one pipeline per consumer name at a time (or give each its own "
            "name); a retry succeeds once the other run ends, or at once if its process died"
        )
    return Lease(conn, name, *got)
